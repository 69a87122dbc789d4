"""The report's verdict: per headline metric, which cells differ from the baseline beyond seed noise.

Each cell is compared with its baseline partner by a paired t-test on the seeds both completed
(scipy.stats.ttest_rel: a seed fixes the initialisation and the batch order of both runs, so the runs pair),
from MIN_PAIRS pairs. The tests of every cell and metric in the verdict form one family, corrected by
Holm's step-down method (Holm 1979), which bounds the family-wise error rate at the stated level without
assuming the tests independent (the metrics of one run are not). Cells whose every seed agrees with the
baseline on every metric (cells.identical) are one computation: reported as identical, never tested.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from attnlab.report import stats
from attnlab.report.cells import Cell, Table, identical, partners
from attnlab.report.stats import MIN_PAIRS, Stat, higher_is_better

DEFAULT_BASELINE = "normalizer=softmax"  # the verdict's baseline when --baseline is not given and the sweep has it


@dataclass
class Comparison:
    """One cell against its baseline partner on one metric."""

    cell: Cell
    base: Cell
    metric: str
    stat: Stat  # the cell's stat with the paired fields (diff_mean, p, n_pairs) filled
    same: bool  # identical to the baseline
    adjusted: float = math.nan  # Holm-adjusted p

    def tested(self) -> bool:
        return not self.same and self.stat.n_pairs >= MIN_PAIRS and math.isfinite(self.stat.p)


def holm(pvalues: list[float]) -> list[float]:
    """Holm-adjusted p-values, in the given order: the i-th smallest of m is max over j <= i of
    min(1, (m − j + 1)·p_(j)); a hypothesis is rejected at family-wise level α when its adjusted p <= α."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [math.nan] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def metrics_of(table: Table) -> list[str]:
    """The verdict's metrics: those the runs' tasks judge them by (Table.judged_by), else all of the table's."""
    return list(table.judged_by) or list(table.metrics)


def baseline_of(table: Table) -> str | None:
    """--baseline, else normalizer=softmax when the cells vary the normalizer and one of them is softmax."""
    if table.baseline:
        return table.baseline
    key, _, value = DEFAULT_BASELINE.partition("=")
    if key in table.group_by and any(c.key.get(key) == value for c in table.cells) and len(table.cells) > 1:
        return DEFAULT_BASELINE
    return None


def comparisons(table: Table, spec: str) -> list[Comparison]:
    """Every (cell, metric) of the verdict, Holm-adjusted over those tested."""
    out = []
    for cell, base in partners(table, spec):
        same = cell.identical if table.baseline else identical(cell, base, table.which)
        for m in metrics_of(table):
            s = cell.stats[m]
            if not table.baseline:  # the table has no paired fields: compare a copy (its interval is not shown)
                s = copy.copy(s)
                stats.compare(s, base.stats[m], m, n_boot=200, test=not same)
            out.append(Comparison(cell, base, m, s, same))
    tested = [c for c in out if c.tested()]
    for c, p in zip(tested, holm([c.stat.p for c in tested])):
        c.adjusted = p
    return out


def _effect(c: Comparison) -> str:
    s = c.stat
    better = (s.diff_mean > 0) == higher_is_better(c.metric)
    return f"{'better' if better else 'worse'}: Δ {s.diff_mean:+.3g}, p={s.p:.3g}, Holm-adjusted p={c.adjusted:.3g}"


def _sentence(metric: str, rows: list[Comparison], spec: str, alpha: float) -> str:
    differ = [c for c in rows if c.tested() and c.adjusted <= alpha]
    same_noise = [c for c in rows if c.tested() and c.adjusted > alpha]
    same = [c for c in rows if c.same]
    untested = [c for c in rows if not c.same and not c.tested()]
    parts = []
    if differ:
        parts.append(
            "differ from "
            + spec
            + " beyond seed noise: "
            + "; ".join(f"{c.cell.label()} ({_effect(c)})" for c in differ)
        )
    if same_noise:
        parts.append(
            "indistinguishable from it at this level: "
            + "; ".join(
                f"{c.cell.label()} (Δ {c.stat.diff_mean:+.3g}, Holm-adjusted p={c.adjusted:.3g})" for c in same_noise
            )
        )
    if same:
        parts.append(
            "identical to it (every seed, every metric equal to float tolerance: one computation): "
            + ", ".join(c.cell.label() for c in same)
        )
    if untested:
        parts.append(
            f"not tested (fewer than {MIN_PAIRS} seeds completed in both): "
            + ", ".join(f"{c.cell.label()} ({c.stat.n_pairs} paired)" for c in untested)
        )
    return f"- **{metric}**: " + ("; ".join(parts) if parts else "no cell to compare") + "."


def verdict(table: Table) -> list[str]:
    """The Verdict section: its method in one paragraph, then one sentence per metric."""
    spec = baseline_of(table)
    if spec is None:
        return [
            "## Verdict",
            "",
            "No baseline: --baseline KEY=VALUE (e.g. normalizer=softmax) names the cell the others are tested against.",
        ]
    rows = comparisons(table, spec)
    if not rows:
        return ["## Verdict", "", f"No cell has a partner in {spec} to compare with."]
    n_tests = sum(c.tested() for c in rows)
    metrics = metrics_of(table)
    chosen = "" if table.baseline else " (the default; --baseline KEY=VALUE picks another)"
    method = (
        f"Against {spec}{chosen}, on {', '.join(metrics)} ({table.which} parameters): a paired t-test on the "
        f"seeds both completed (scipy.stats.ttest_rel, from {MIN_PAIRS} pairs), with Holm's correction over "
        f"the {n_tests} (cell, metric) comparison(s) tested, at family-wise α = {table.alpha:g}."
    )
    lines = ["## Verdict", "", method, ""]
    for m in metrics:
        lines.append(_sentence(m, [c for c in rows if c.metric == m], spec, table.alpha))
    return lines
