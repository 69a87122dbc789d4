"""Sweep reports: per-cell statistics over seeds, paired baseline tests, lr selection (`attnlab-report`).

Statistics of a cell use its *completed* runs with a finite value of the metric; diverged, failed,
interrupted and incomplete runs are counted beside them, never averaged in. A baseline comparison pairs runs by `seed`
and calls a difference "within seed noise" when |mean difference| <= the seed-to-seed standard deviation
of the paired differences (an effect size below one standard deviation, whatever the number of seeds);
the paired t-test p-value is reported next to it.

Small n: below SMALL_N (5) values a cell's interval is the Student-t one, marked "low n" (none for one
value), not the bootstrap's; below MIN_PAIRS (3) pairs the differences are reported without a p-value.

The report opens with a verdict (verdict.py): per headline metric, the cells that differ from the baseline
(--baseline, else normalizer=softmax when the sweep has it) by a paired t-test, those equivalent to it within a
margin by two one-sided tests (both Holm-corrected over every cell and metric tested), those it cannot resolve (with
the interval, the detectable effect and the seeds needed), and those identical to it (every seed, every metric
equal to float32 tolerance: one computation, never shown as Δ 0); a sweep whose cells all sit at a plateau of their
task is said to be unable to rank them, and cells still learning are ranked at the budget they were given, the
verdict's first sentence naming it and whether the ranking held over the last half of the evaluations (budget.py).
The baseline is one cell per comparison (--baseline KEY=VALUE[,KEY=VALUE...]); under --select-lr a cell whose rate
is the edge of its grid is named (report.csv's lr_at_edge). Provenance (provenance.py) and runs still running
(running.py) come before it.

Modules, one concern each: load (run directories and TensorBoard scalars → records), stats (one metric
over seeds: intervals, paired comparison, equivalence and power, lr selection), cells (grouping runs into cells:
`summarize`), verdict (the opening conclusion), formation (what must have formed for it: --formed), budget (its
opening at equal budget), comparison (Δ per cell), provenance, running (runs without an outcome yet), tables
(Markdown, LaTeX, CSV), plots (learning curves), write (a report directory), cli (`attnlab-report`).
"""

from attnlab.report.cells import Cell, Table, default_metrics, summarize
from attnlab.report.load import (
    LR,
    SEED,
    Run,
    drifted_keys,
    load_runs,
    read_scalars,
    same_value,
    sort_key,
    varying_keys,
)
from attnlab.report.stats import HIGHER_IS_BETTER, MIN_PAIRS, SMALL_N, Stat, bootstrap_ci, t_ci
from attnlab.report.write import write_report
from attnlab.run.record import STATUSES

__all__ = [
    "HIGHER_IS_BETTER",
    "LR",
    "MIN_PAIRS",
    "SEED",
    "SMALL_N",
    "STATUSES",
    "Cell",
    "Run",
    "Stat",
    "Table",
    "bootstrap_ci",
    "default_metrics",
    "drifted_keys",
    "load_runs",
    "read_scalars",
    "same_value",
    "sort_key",
    "summarize",
    "t_ci",
    "varying_keys",
    "write_report",
]
