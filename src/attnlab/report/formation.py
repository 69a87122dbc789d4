"""Whether the phenomenon a study asks about formed: a condition on a metric per seed (`--formed METRIC>=VALUE`), met
in how many seeds of each cell, the cells whose seeds split across its threshold, the curves still moving at the end.

A comparison whose baseline did not form it in every seed is not tested (under `--formed-in every`, nor one whose own
cell did not): a difference to a baseline without the phenomenon says nothing about the phenomenon. Seeds on both
sides of a threshold are named one by one, never averaged into one mean: their mean lies where no seed is.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

from attnlab.report import budget, plots
from attnlab.report.cells import Cell, Table, baseline_pairs, is_baseline, partners
from attnlab.report.load import Run
from attnlab.report.stats import per_seed
from attnlab.report.tables import num
from attnlab.run.convergence import still_moving

OPERATORS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
SCOPES = ("baseline", "every")  # --formed-in: whose seeds must all have formed it for a comparison to be tested
CONDITION = re.compile(r"^\s*([^<>=\s]+)\s*(>=|<=|>|<)\s*(\S+)\s*$")
EXAMPLE = "test/attn_first_weight/layer_0>=0.3"


@dataclass(frozen=True)
class Condition:
    """`metric op threshold`, met or not by each seed's value of the metric."""

    metric: str
    op: str
    threshold: float
    text: str  # as written on the command line, spaces dropped

    def holds(self, value: float) -> bool:
        return OPERATORS[self.op](value, self.threshold)


def parse(text: str, names: list[str]) -> Condition:
    """A --formed condition; ValueError naming what is wrong and what is allowed (`names`: the runs' metrics)."""
    match = CONDITION.match(text)
    try:
        threshold = float(match.group(3)) if match else math.nan
    except ValueError:
        threshold = math.nan
    if not math.isfinite(threshold):
        raise ValueError(
            f"--formed {text!r} is not a condition; allowed: METRIC>=VALUE, METRIC<=VALUE, METRIC>VALUE or "
            f"METRIC<VALUE with VALUE a number, e.g. {EXAMPLE}"
        )
    metric, op, value = match.groups()
    if metric not in names:
        raise ValueError(f"--formed {text!r}: {metric} is in no completed run's record; allowed: {', '.join(names)}")
    return Condition(metric, op, threshold, f"{metric}{op}{value}")


def conditions(texts: list[str], runs: list[Run], which: str) -> list[Condition]:
    """The --formed conditions, checked against the metrics of the completed runs' `which` records."""
    records = [r.final if which == "final" else r.best for r in runs if r.status == "completed"]
    names = sorted({k for rec in records for k in rec if k != "step"})
    return [parse(t, names) for t in texts]


def count(cond: Condition, cell: Cell, which: str) -> tuple[int, int]:
    """(seeds of the cell that met the condition, seeds with a value of its metric)."""
    values = per_seed(cell.runs, cond.metric, which)
    return sum(cond.holds(v) for v in values.values()), len(values)


def split(table: Table, cell: Cell, metric: str) -> str:
    """`split: seed 0 0.258, seed 1 0.351` where the cell's seeds lie on both sides of a threshold on `metric`,
    else ''."""
    for cond in (c for c in table.formed if c.metric == metric):
        met, n = count(cond, cell, table.which)
        if 0 < met < n:
            values = per_seed(cell.runs, metric, table.which)
            return "split: " + ", ".join(f"seed {s} {num(v)}" for s, v in values.items())
    return ""


def withheld(table: Table, cell: Cell, metric: str, base: Cell | None = None) -> str:
    """Why the comparison of `cell` with its baseline partner (`base`, else found) on `metric` is not tested: a
    condition not met in every seed of the baseline (or, under --formed-in every, of the cell), or seeds split across
    a threshold on `metric`; '' when it is tested."""
    base = base or _partner(table, cell)
    if base is None:
        return ""
    judged = [("the baseline", base), *([(cell.label(), cell)] if table.formed_in == "every" else [])]
    for cond in table.formed:
        for who, c in judged:
            met, n = count(cond, c, table.which)
            if met < n or not n:
                return f"{who} formed {'it' if len(table.formed) == 1 else cond.text} in {met} of {n} seeds"
    named = [f"{c.label()}: {text.removeprefix('split: ')}" for c in (cell, base) if (text := split(table, c, metric))]
    return f"seeds split at its threshold ({'; '.join(named)})" if named else ""


def _partner(table: Table, cell: Cell) -> Cell | None:
    return next((b for c, b in partners(table, table.baseline) if c is cell), None) if table.baseline else None


def section(table: Table, spec: str | None) -> list[str]:
    """The verdict's opening: per condition, the seeds of each cell that met it, the cells whose seeds split, and
    the runs whose curve of its metric still moved over the last quarter of training."""
    pairs = baseline_pairs(spec) if spec else []
    lines = []
    logged = plots.logged([r for c in table.cells for r in c.done()]) if table.formed else []
    for cond in table.formed:
        tag = budget.curve_tag(table, cond.metric, logged, fallback=())
        unknown = "" if tag else " (no run logged a curve of it: whether it still moved is not known)"
        lines.append(f"**Formed**: {cond.text} per seed{unknown}, in")
        for c in table.cells:
            met, n = count(cond, c, table.which)
            role = ", the baseline" if pairs and is_baseline(c.key, pairs) else ""
            notes = [text for text in (split(table, c, cond.metric), _moving(table, c, tag)) if text]
            lines.append(f"- {met} of {n} seeds of {c.label()}{role}" + "".join(f"; {t}" for t in notes))
        lines.append("")
    if table.formed and spec:
        whose = "its baseline and the cell" if table.formed_in == "every" else "its baseline"
        lines += [f"A comparison is tested only where {whose} formed {_them(table)} in every seed.", ""]
    return lines


def _them(table: Table) -> str:
    return "it" if len(table.formed) == 1 else "each"


def _moving(table: Table, cell: Cell, tag: str | None) -> str:
    """`still moving over the last quarter of attn_first_weight/layer_0 in 2 of 3 runs` (convergence.still_moving),
    or '' when none did or no run logged the curve."""
    if tag is None:
        return ""
    runs = plots.logged(cell.done())
    curves = [(r, scalars.get(tag, {})) for r, scalars in zip(runs, plots.run_scalars(runs, table.cache))]
    verdicts = [still_moving(curve, r.config.get(budget.STEPS) or max(curve, default=0)) for r, curve in curves]
    known = [v for v in verdicts if v is not None]
    moved = sum(known)
    return f"still moving over the last quarter of {tag} in {moved} of {len(known)} runs" if moved else ""
