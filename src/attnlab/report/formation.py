"""Whether the phenomenon a study asks about formed: a condition on a metric per seed (`--formed METRIC>=VALUE`), met
in how many seeds of each cell, the cells whose seeds split across its threshold, the curves still moving at the end.
A phenomenon that rises and falls during training (logit growth, an entropy collapse that recovers, a sink that forms
and dissolves) is read from its curve: `max(TAG)` or `min(TAG)` is a seed's extreme over every logged step of the
TensorBoard scalars matching TAG (an fnmatch pattern, e.g. `max(attn_max_logit/layer_1/*)` over a layer's heads).

A comparison whose baseline did not form it in every seed is not tested (under `--formed-in every`, nor one whose own
cell did not): a difference to a baseline without the phenomenon says nothing about the phenomenon. Seeds on both
sides of a threshold are named one by one, never averaged into one mean: their mean lies where no seed is.
"""

from __future__ import annotations

import fnmatch
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from attnlab.report import budget, plots
from attnlab.report.cells import Cell, Table, baseline_pairs, is_baseline, partners
from attnlab.report.load import Run, sort_key
from attnlab.report.stats import per_seed
from attnlab.report.tables import num
from attnlab.run.convergence import still_moving

OPERATORS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
SCOPES = ("baseline", "every")  # --formed-in: whose seeds must all have formed it for a comparison to be tested
CONDITION = re.compile(r"^\s*([^<>=\s]+)\s*(>=|<=|>|<)\s*(\S+)\s*$")
CURVE = re.compile(r"^(max|min)\((.+)\)$")  # a curve's extreme over training: max(TAG) or min(TAG)
EXAMPLE = "test/attn_first_weight/layer_0>=0.3"
EXTREMES = {"max": max, "min": min}


@dataclass(frozen=True)
class Condition:
    """`metric op threshold`, met or not by each seed's value of the metric."""

    metric: str  # a metric of the runs' records, or max(TAG) / min(TAG): a curve's extreme over training
    op: str
    threshold: float
    text: str  # as written on the command line, spaces dropped

    def holds(self, value: float) -> bool:
        return OPERATORS[self.op](value, self.threshold)

    @property
    def curve(self) -> tuple[str, str] | None:
        """(max or min, the tag pattern) of a condition on a curve's extreme, else None."""
        match = CURVE.match(self.metric)
        return (match.group(1), match.group(2)) if match else None


def parse(text: str, names: list[str], tags: Callable[[], list[str]]) -> Condition:
    """A --formed condition; ValueError naming what is wrong and what is allowed (`names`: the runs' metrics, `tags`:
    their logged curves, read only for a condition on a curve)."""
    match = CONDITION.match(text)
    try:
        threshold = float(match.group(3)) if match else math.nan
    except ValueError:
        threshold = math.nan
    if not math.isfinite(threshold):
        raise ValueError(
            f"--formed {text!r} is not a condition; allowed: METRIC>=VALUE, METRIC<=VALUE, METRIC>VALUE or "
            f"METRIC<VALUE with VALUE a number, e.g. {EXAMPLE}; METRIC a metric of metrics.json, or max(TAG) or "
            f"min(TAG): a curve's extreme over training"
        )
    metric, op, value = match.groups()
    if curve := CURVE.match(metric):
        if not fnmatch.filter(logged := tags(), curve.group(2)):
            raise ValueError(
                f"--formed {text!r}: no completed run logged a curve matching {curve.group(2)}; allowed: a pattern "
                f"of the logged tags, e.g. {', '.join(logged[:8]) or '(none logged)'}"
            )
    elif metric not in names:
        raise ValueError(f"--formed {text!r}: {metric} is in no completed run's record; allowed: {', '.join(names)}")
    return Condition(metric, op, threshold, f"{metric}{op}{value}")


def conditions(texts: list[str], runs: list[Run], which: str, cache: dict) -> list[Condition]:
    """The --formed conditions, checked against the metrics of the completed runs' `which` records and their
    curves (read into `cache`)."""
    completed = [r for r in runs if r.status == "completed"]
    records = [r.final if which == "final" else r.best for r in completed]
    names = sorted({k for rec in records for k in rec if k != "step"})
    return [parse(t, names, lambda: plots.scalar_tags(plots.logged(completed), cache)) for t in texts]


def values(cond: Condition, cell: Cell, table: Table) -> dict:
    """{seed: its value of the condition's metric, or of its curve's extreme} over the cell's completed runs."""
    if cond.curve is None:
        return per_seed(cell.runs, cond.metric, table.which)
    extreme, pattern = cond.curve
    runs = plots.logged([r for r in cell.runs if r.status == "completed"])
    by_seed: dict = {}
    for run, scalars in zip(runs, plots.run_scalars(runs, table.cache)):
        points = [v for tag in fnmatch.filter(scalars, pattern) for v in scalars[tag].values() if math.isfinite(v)]
        if points:
            by_seed.setdefault(run.seed, []).append(EXTREMES[extreme](points))
    return {s: sum(v) / len(v) for s, v in sorted(by_seed.items(), key=lambda item: sort_key(item[0]))}


def count(cond: Condition, cell: Cell, table: Table) -> tuple[int, int]:
    """(seeds of the cell that met the condition, seeds with a value of its metric)."""
    found = values(cond, cell, table)
    return sum(cond.holds(v) for v in found.values()), len(found)


def split(table: Table, cell: Cell, metric: str) -> str:
    """`split: seed 0 0.258, seed 1 0.351` where the cell's seeds lie on both sides of a threshold on `metric`,
    else ''."""
    for cond in (c for c in table.formed if c.metric == metric):
        met, n = count(cond, cell, table)
        if 0 < met < n:
            return "split: " + ", ".join(f"seed {s} {num(v)}" for s, v in values(cond, cell, table).items())
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
            met, n = count(cond, c, table)
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
        tag = None if cond.curve else budget.curve_tag(table, cond.metric, logged, fallback=())
        unknown = "" if tag or cond.curve else " (no run logged a curve of it: whether it still moved is not known)"
        over = f" ({cond.curve[0]} over training of every curve matching {cond.curve[1]})" if cond.curve else ""
        lines.append(f"**Formed**: {cond.text} per seed{over}{unknown}, in")
        for c in table.cells:
            met, n = count(cond, c, table)
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
