"""attnlab's configs, shipped inside the wheel as the package `attnlab.configs` (pyproject.toml's package-dir)."""
