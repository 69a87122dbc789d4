"""The docs' lists of normalizers and statistics, drawn from the registries (as module_graph.py draws the imports).

Each list sits in a Markdown file between `<!-- doc list NAME: begin -->` and `<!-- doc list NAME: end -->`; this
script writes them, and tests/test_doc_lists.py fails when one differs from what it would write.

    python scripts/doc_lists.py            # say which lists are stale
    python scripts/doc_lists.py --write    # rewrite them
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cell(text: str) -> str:
    """One Markdown table cell: whitespace folded, a pipe escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _leading_comment(path: Path) -> str:
    """The comment lines a YAML opens with: what the choice computes, and its paper."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# "))
    return " ".join(lines)


def normalizers() -> str:
    """README's table: every registered normalizer, its YAML's opening comment, its `normalizer.impl` values."""
    from attnlab import config
    from attnlab.backends.impl import allowed
    from attnlab.config import registry

    rows = ["| `normalizer=` | what | `normalizer.impl` |", "|---|---|---|"]
    for name in registry.choices("normalizer"):
        norm = config.normalizer(name, num_heads=2, head_dim=8)
        impls = " \\| ".join(allowed(norm.capability()))
        rows.append(
            f"| `{name}` | {_cell(_leading_comment(registry.CONFIG_DIR / 'normalizer' / f'{name}.yaml'))} | {impls} |"
        )
    return "\n".join(rows)


def statistics() -> str:
    """REFERENCE.md's table: every declared statistic, how it is computed, and whether it is in the final metrics."""
    from attnlab.statistics import STATISTICS

    def source(s) -> str:
        if s.of_rows is not None:
            return "every normalizer (`core_stats`)"
        if s.of_maps is not None:
            return "the explicit weights, final metrics only"
        if s.extreme:
            return "the model (`model.extreme_token_stats`)"
        return "its own (a normalizer's extras, the output gate)"

    final = {"layer": "per layer", "head": "per layer and head", None: "—"}
    rows = ["| key | what | from | final metrics |", "|---|---|---|---|"]
    for s in STATISTICS:
        rate = f", and `{s.rate}`" if s.rate else ""
        rows.append(f"| `{s.name}` | {_cell(s.description)} | {source(s)} | {final[s.final]}{rate} |")
    return "\n".join(rows)


LISTS = {"normalizers": (ROOT / "README.md", normalizers), "statistics": (ROOT / "docs/REFERENCE.md", statistics)}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- doc list {name}: begin -->\n)(.*?)(<!-- doc list {name}: end -->)", re.S)


def stale() -> list[str]:
    """The lists whose text in their file differs from what the registries give (or whose markers are missing)."""
    out = []
    for name, (path, make) in LISTS.items():
        found = _block(name).search(path.read_text())
        if found is None or found.group(2) != make() + "\n":
            out.append(f"{path.relative_to(ROOT)}: doc list {name}")
    return out


def write() -> None:
    for name, (path, make) in LISTS.items():
        text = path.read_text()
        new, count = _block(name).subn(lambda m, make=make: m.group(1) + make() + "\n" + m.group(3), text)
        if count != 1:
            raise SystemExit(f"{path}: no <!-- doc list {name}: begin/end --> markers")
        path.write_text(new)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the lists")
    if parser.parse_args().write:
        write()
    problems = stale()
    print("\n".join(f"stale: {p} (python scripts/doc_lists.py --write)" for p in problems) or "doc lists up to date")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
