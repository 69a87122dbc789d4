"""The next learning rate beyond the edge of each cell's grid, from an `attnlab-report --select-lr` report.csv.

    python experiments/bracket_lrs.py REPORT_CSV GROUP_KEY[,GROUP_KEY...]            # one line per rate to add
    python experiments/bracket_lrs.py REPORT_CSV GROUP_KEY[,GROUP_KEY...] --edges    # the cells at an edge, in words

A cell whose selected rate is the lowest or highest of the rates it was given (report.csv's lr_at_edge: low | high)
has not bracketed its optimum: the script prints `KEY=value ... optim.lr=RATE` with RATE one step beyond that edge,
a step being the grid's own ratio, the geometric mean of its neighbouring rates' ratios ((highest / lowest) ^ (1 /
(rates - 1)): ×3.16 for 1e-3, 3e-3, 1e-2, so 1e-2 extends to 0.0316, then 0.1), the rate printed to 3 significant
figures; a grid of k rates per decade stays on its lattice (see `beyond`). A cell given one rate only
(lr_at_edge only) gets both neighbours, the step taken from the widest grid of the other cells. Nothing is printed
when every cell's rate is interior. experiments/study.sh's bracket_screen loops over it.
"""

from __future__ import annotations

import csv
import math
import sys

LR = "optim.lr"


def cells(csv_path: str, keys: list[str]) -> list[dict]:
    """One row per cell (report.csv holds one per cell and metric); SystemExit when the columns are missing."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    need = [*keys, LR, "lr_at_edge", "lr_grid"]
    if not rows or any(k not in rows[0] for k in need):
        sys.exit(
            f"bracket_lrs: {csv_path} has no {', '.join(repr(k) for k in need if not rows or k not in rows[0])} "
            "column(s) (an attnlab-report --select-lr report.csv, grouped by those keys?)"
        )
    seen: dict[tuple, dict] = {}
    for r in rows:
        seen.setdefault(tuple(r[k] for k in keys), r)
    return list(seen.values())


def grid(row: dict) -> list[float]:
    return sorted(float(x) for x in row["lr_grid"].split())


def step(rates: list[float]) -> float | None:
    """The grid's step in log10: (log highest − log lowest) / (rates − 1), the log of the geometric mean of its
    neighbouring rates' ratios; None for fewer than two distinct positive rates."""
    logs = sorted({math.log10(x) for x in rates if x > 0})
    return (logs[-1] - logs[0]) / (len(logs) - 1) if len(logs) > 1 else None


def beyond(edge: float, log_step: float, direction: int, rates: list[float] = ()) -> float:
    """One step beyond `edge` (direction +1 up, −1 down). A grid of k rates per decade (1e-3, 3e-3, 1e-2: k = 2)
    stays on its lattice: the new rate is `edge` × 10^(±1/k), rounded to 10^(j/k) where one of the grid's `rates` is
    a power of ten to that lattice, so 1e-2 extends to 10^-1.5 (0.0316) and then to 0.1, not to 0.0999 by compounded
    rounding, and 3e-4, 1e-3, 3e-3 extends down to 1e-4; another grid by its own ratio."""
    target = math.log10(edge) + direction * log_step
    k = round(1 / log_step)
    if k >= 1 and abs(1 / log_step - k) <= 0.1 * k:
        decades = any(abs(v * k - round(v * k)) < 0.05 for v in map(math.log10, [edge, *rates]))
        anchor = 0.0 if decades else math.log10(edge)
        target = anchor + round((target - anchor) * k) / k
    return 10**target


def rate(x: float) -> str:
    """3 significant figures, as Hydra reads a float: 0.0316, 3.16e-05."""
    return f"{float(f'{x:.3g}'):g}"


def extensions(rows: list[dict]) -> list[tuple[dict, float]]:
    """(row, the rate to add) for every cell at an edge of its grid."""
    grids = [grid(r) for r in rows if step(grid(r)) is not None]
    widest = step(max(grids, key=len)) if grids else None  # the step for a cell given one rate
    out = []
    for r in rows:
        edge, rates = r["lr_at_edge"], grid(r)
        if edge not in ("low", "high", "only") or not rates:
            continue
        s = step(rates) if edge != "only" else widest
        if s is None:
            sys.exit(f"bracket_lrs: cell {r} has one rate and no other cell has a grid to take a step from")
        if edge in ("low", "only"):
            out.append((r, beyond(rates[0], s, -1, rates)))
        if edge in ("high", "only"):
            out.append((r, beyond(rates[-1], s, +1, rates)))
    return out


def main(argv: list[str]) -> None:
    args = [a for a in argv if a != "--edges"]
    if len(args) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    csv_path, keys = args[0], [k for k in args[1].split(",") if k]
    rows = cells(csv_path, keys)
    label = lambda r: " ".join(f"{k}={r[k]}" for k in keys)  # noqa: E731
    if "--edges" in argv:
        for r in rows:
            if r["lr_at_edge"]:
                rates = grid(r)
                where = "the only rate given" if r["lr_at_edge"] == "only" else f"the {r['lr_at_edge']} edge"
                print(f"{label(r)}: {LR}={r[LR]}, {where} of {', '.join(rate(x) for x in rates)}")
        return
    for r, lr in extensions(rows):
        print(f"{label(r)} {LR}={rate(lr)}")


if __name__ == "__main__":
    main(sys.argv[1:])
