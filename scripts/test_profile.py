"""What the test suite costs, by folder and by fixture, against its budget (`make test-profile`).

Reads the per-test records tests/profile_plugin.py wrote (one .jsonl per xdist worker) and prints: the suite's
worker-seconds against the budget (6 minutes of wall time on 2 workers) and the wall time its CPU seconds allow at
best; per test folder the tests, wall seconds, CPU seconds (the worker's and its child processes'), XLA compiles and
their seconds, and subprocesses started; the fixtures whose setups cost most; the costliest test functions (their
parametrizations summed); and the slowest tests. Usage: python scripts/test_profile.py DIR [--markdown] [--top N].
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

BUDGET_WALL_S = 6 * 60
WORKERS = 2
FIELDS = ("wall_s", "cpu_s", "child_cpu_s", "compiles", "compile_s", "trace_s", "subprocesses")


def load(directory: Path) -> tuple[list[dict], list[dict]]:
    records = [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]
    if not records:
        raise SystemExit(
            f"test_profile: no records in {directory} (run pytest -p profile_plugin with ATTNLAB_TEST_PROFILE)"
        )
    return [r for r in records if r["kind"] == "test"], [r for r in records if r["kind"] == "fixture"]


def folder(nodeid: str) -> str:
    """tests/<folder>/ for a test in a folder, else its file (tests/test_cli.py)."""
    path = nodeid.split("::")[0]
    parts = path.split("/")
    return "/".join(parts[:2]) + "/" if len(parts) > 2 else path


def grouped(tests: list[dict], key) -> list[tuple[str, int, dict]]:
    """(group, its tests, their FIELDS summed) per key(nodeid), the costliest in wall seconds first."""
    sums: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    counts: collections.Counter = collections.Counter()
    for t in tests:
        group = key(t["test"])
        counts[group] += 1
        sums[group].update({f: t.get(f, 0) for f in FIELDS})
    return sorted(((k, counts[k], sums[k]) for k in sums), key=lambda row: -row[2]["wall_s"])


def by_folder(tests: list[dict]) -> list[tuple[str, int, dict]]:
    return grouped(tests, folder)


def by_fixture(fixtures: list[dict]) -> list[tuple[str, str, int, float]]:
    sums: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    scopes = {}
    for f in fixtures:
        sums[f["fixture"]] += f["wall_s"]
        counts[f["fixture"]] += 1
        scopes[f["fixture"]] = f["scope"]
    return [(name, scopes[name], counts[name], total) for name, total in sums.most_common()]


def by_function(tests: list[dict]) -> list[tuple[str, int, float, int]]:
    """(test function, its parametrizations, their wall seconds, their compiles), the costliest first: the unit a
    tier move or a shared fixture acts on."""
    return [(name, n, s["wall_s"], s["compiles"]) for name, n, s in grouped(tests, lambda nodeid: nodeid.split("[")[0])]


def table(header: list[str], rows: list[list], markdown: bool) -> str:
    cells = [header, *[[str(c) for c in row] for row in rows]]
    if markdown:
        lines = ["| " + " | ".join(row) + " |" for row in cells]
        lines.insert(1, "|" + "|".join("---" for _ in header) + "|")
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells
    )


def row(name: str, n: int, s: dict) -> list:
    """A folder's line: its tests and sums (seconds rounded)."""
    return [name, n, *(f"{s[f]:.0f}" if f.endswith("_s") else s[f] for f in FIELDS)]


def report(directory: Path, markdown: bool = False, top: int = 15) -> str:
    tests, fixtures = load(directory)
    total = collections.Counter()
    for t in tests:
        total.update({f: t.get(f, 0) for f in FIELDS})
    rows = [row(name, n, s) for name, n, s in by_folder(tests)] + [row("all", len(tests), total)]
    budget = BUDGET_WALL_S * WORKERS
    cpu = total["cpu_s"] + total["child_cpu_s"]
    out = [
        f"{len(tests)} tests, {total['wall_s']:.0f} worker-seconds of {budget} "
        f"(budget: {BUDGET_WALL_S // 60} min of wall time on {WORKERS} workers): {total['wall_s'] / budget:.0%}",
        # on as many cores as workers, the CPU time bounds the wall time from below whatever the scheduling
        f"CPU: {total['cpu_s']:.0f} s in the workers + {total['child_cpu_s']:.0f} s in their child processes = "
        f"{cpu:.0f} s, at least {cpu / WORKERS:.0f} s of wall time on {WORKERS} cores (budget {BUDGET_WALL_S} s)",
        "",
        table(
            ["folder", "tests", "wall s", "cpu s", "child cpu s", "compiles", "compile s", "trace s", "subprocesses"],
            rows,
            markdown,
        ),
        "",
        table(
            ["fixture", "scope", "setups", "wall s"],
            [[n, s, c, f"{w:.1f}"] for n, s, c, w in by_fixture(fixtures)[:top]],
            markdown,
        ),
        "",
        table(
            ["costliest test function", "tests", "wall s", "compiles"],
            [[name, n, f"{wall:.1f}", compiles] for name, n, wall, compiles in by_function(tests)[:top]],
            markdown,
        ),
        "",
        table(
            ["slowest test", "wall s", "compiles", "subprocesses"],
            [
                [t["test"], f"{t['wall_s']:.1f}", t["compiles"], t["subprocesses"]]
                for t in sorted(tests, key=lambda t: -t["wall_s"])[:top]
            ],
            markdown,
        ),
    ]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--markdown", action="store_true", help="tables in Markdown, for BENCHMARKS.md")
    parser.add_argument("--top", type=int, default=15, help="how many fixtures and tests to list")
    args = parser.parse_args()
    print(report(args.directory, args.markdown, args.top))


if __name__ == "__main__":
    main()
