"""The verdict's statistics: each cell against its baseline partner, per metric, on the seeds both completed (a seed
fixes the initialisation and the batch order of both runs, so the runs pair), from MIN_PAIRS pairs:

- *differs*: a paired t-test (scipy.stats.ttest_rel) rejects Δ = 0 after Holm's step-down correction (Holm 1979) over
  every (cell, metric) tested, at family-wise level α; Holm bounds the family-wise error without assuming the tests
  independent (the metrics of one run are not).
- *equivalent within ±m*: two one-sided paired t-tests (Schuirmann 1987) reject |Δ| >= m, Holm-corrected over the
  same family, at level α. m is the metric's margin (stats.default_margin, or --margin).
- *not resolved*: neither. The verdict then gives Δ's 95% interval, the smallest |Δ| these pairs detect at 80% power
  and the seeds the observed Δ would need, both for the two-sided paired t-test at level α/k, k the tests in the
  family (Holm's first, strictest step: an effect of that size is found whatever the other tests do).

Cells whose every seed agrees with the baseline on every metric (cells.identical) are one computation: reported as
identical, never tested. verdict.py words what these find.
"""

from __future__ import annotations

import copy
import fnmatch
import math
from dataclasses import dataclass

from attnlab.report import formation, stats
from attnlab.report.cells import DEFAULT_BASELINE, Cell, Table, identical, partners
from attnlab.report.stats import MIN_PAIRS, Stat


@dataclass
class Comparison:
    """One cell against its baseline partner on one metric."""

    cell: Cell
    base: Cell
    metric: str
    stat: Stat  # the cell's stat with the paired fields (diff_mean, p, n_pairs, diffs) filled
    same: bool  # identical to the baseline
    direction: str | None = "lower"  # which values of the metric are better (Table.direction); None: neither
    margin: float = math.nan  # the equivalence margin m
    adjusted: float = math.nan  # Holm-adjusted p of the t-test
    tost: float = math.nan  # two one-sided tests' p
    tost_adjusted: float = math.nan  # its Holm-adjusted p
    detectable: float = math.nan  # smallest |Δ| detected at stats.POWER from these pairs
    needed: int | None = None  # pairs needed to detect the observed Δ at stats.POWER
    withheld: str = ""  # why it is not tested although it could be (formation.withheld): nothing formed, split seeds

    def tested(self) -> bool:
        return not self.same and not self.withheld and self.stat.n_pairs >= MIN_PAIRS and math.isfinite(self.stat.p)

    def outcome(self, alpha: float) -> str:
        """identical | withheld | untested | differs | equivalent | unresolved."""
        if self.same:
            return "identical"
        if self.withheld:
            return "withheld"
        if not self.tested():
            return "untested"
        if self.adjusted <= alpha:
            return "differs"
        return "equivalent" if self.tost_adjusted <= alpha else "unresolved"


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
    if table.no_default_baseline:
        return None
    key, _, value = DEFAULT_BASELINE.partition("=")
    if key in table.group_by and any(c.key.get(key) == value for c in table.cells) and len(table.cells) > 1:
        return DEFAULT_BASELINE
    return None


def margin_of(table: Table, metric: str, base: Cell) -> float:
    """The metric's equivalence margin: the first --margin pattern matching it, else stats.default_margin."""
    for pattern, value in table.margins.items():
        if fnmatch.fnmatchcase(metric, pattern):
            return value
    return stats.default_margin(metric, base.stats[metric].mean)


def comparisons(table: Table, spec: str) -> list[Comparison]:
    """Every (cell, metric) of the verdict: t-test and TOST Holm-adjusted over those tested, power of each."""
    out = []
    for cell, base in partners(table, spec):
        same = cell.identical if table.baseline else identical(cell, base, table.which)
        for m in metrics_of(table):
            s = cell.stats[m]
            if not table.baseline:  # the table has no paired fields: compare a copy (its interval is not shown)
                s = copy.copy(s)
                stats.compare(s, base.stats[m], m, n_boot=200, test=not same)
            out.append(
                Comparison(
                    cell,
                    base,
                    m,
                    s,
                    same,
                    table.direction(m),
                    margin=margin_of(table, m, base),
                    withheld=formation.withheld(table, cell, m, base),
                )
            )
    tested = [c for c in out if c.tested()]
    for c in tested:
        c.tost = stats.tost_p(list(c.stat.diffs.values()), c.margin)
    for c, p, q in zip(tested, holm([c.stat.p for c in tested]), holm([_or_one(c.tost) for c in tested])):
        c.adjusted, c.tost_adjusted = p, q
    level = table.alpha / max(len(tested), 1)
    for c in tested:
        c.detectable = stats.detectable_effect(c.stat.diff_std, c.stat.n_pairs, level)
        c.needed = stats.seeds_needed(c.stat.diff_mean, c.stat.diff_std, level)
    return out


def _or_one(p: float) -> float:
    return p if math.isfinite(p) else 1.0
