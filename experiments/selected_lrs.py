"""Print `GROUP_KEY=value optim.lr=rate` per cell of a `attnlab-report --select-lr` report.csv (one line each)."""

import csv
import sys


def main(csv_path: str, group_key: str) -> None:
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or group_key not in rows[0] or "optim.lr" not in rows[0]:
        sys.exit(f"selected_lrs: {csv_path} has no '{group_key}' and 'optim.lr' columns (was --select-lr given?)")
    seen = dict.fromkeys((r[group_key], r["optim.lr"]) for r in rows if r["optim.lr"])
    for value, lr in seen:
        print(f"{group_key}={value} optim.lr={lr}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
