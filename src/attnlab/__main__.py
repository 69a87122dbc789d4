"""`python -m attnlab` is `attnlab-train`."""

from attnlab.cli import train_main

if __name__ == "__main__":
    train_main()
