"""The report's verdict, in words: per headline metric, which cells differ from the baseline, which are equivalent
to it within a stated margin, and which this sweep cannot resolve (the statistics: paired.py).

When every compared cell sits at a plateau of its task (Cell.plateaued: nothing learnt), the verdict first says that
this sweep cannot rank them. When a compared cell was still learning, the cells are ranked at the budget they were
given, and the verdict's first sentence says so: the budget (steps, examples, tokens) and whether the ranking held over
the last half of the evaluations, naming the cells whose val curves cross there (budget.py).

Before all of it: what must have formed (formation.py, --formed), and where the baseline is several cells, the rule
that pairs each cell with one of them (pairing).
"""

from __future__ import annotations

from attnlab.report import formation, stats
from attnlab.report.budget import at_budget
from attnlab.report.cells import Cell, Table, baseline_pairs, is_baseline, partners
from attnlab.report.load import LR
from attnlab.report.paired import Comparison, baseline_of, comparisons, metrics_of
from attnlab.report.stats import MIN_PAIRS
from attnlab.report.tables import edge_text, num

# Where the reference manual says which scale separates the normalizers: the verdict's pointer when a sweep cannot rank.
SCALE_GUIDE = (
    "docs/REFERENCE.md, 'Which scale separates the normalizers on a CPU' (the default MQAR at model=small, "
    "trainer.steps=800, optim.lr=3e-3)"
)


def _interval(c: Comparison) -> str:
    lo, hi = c.stat.diff_ci
    return f"[{num(lo, True)}, {num(hi, True)}]"


def _effect(c: Comparison) -> str:
    """`better: Δ ...` or `worse: Δ ...`; `higher: Δ ...` or `lower: Δ ...` for a metric without a better direction."""
    s = c.stat
    if c.direction is None:
        word = "higher" if s.diff_mean > 0 else "lower"
    else:
        word = "better" if (s.diff_mean > 0) == (c.direction == "higher") else "worse"
    inside = f"; within the ±{num(c.margin)} margin" if abs(s.diff_mean) < c.margin else ""
    return f"{word}: Δ {num(s.diff_mean, True)} {_interval(c)}, p={s.p:.3g}, Holm-adjusted p={c.adjusted:.3g}{inside}"


def _unresolved(c: Comparison) -> str:
    s = c.stat
    need = (
        f"the observed Δ needs {c.needed} seeds"
        if c.needed is not None
        else f"the observed Δ needs more than {stats.MAX_SEEDS} seeds"
    )
    return (
        f"{c.cell.label()}: Δ in {_interval(c)} (Δ {num(s.diff_mean, True)}, Holm-adjusted p={c.adjusted:.3g}; "
        f"these {s.n_pairs} seeds detect |Δ| >= {num(c.detectable)} at {stats.POWER:.0%} power, {need})"
    )


def _sentence(rows: list[Comparison], spec: str, alpha: float) -> str:
    """What one metric's comparisons found, without the metric's name (metrics that found the same share a line)."""
    groups = {k: [c for c in rows if c.outcome(alpha) == k] for k in ("differs", "equivalent", "unresolved")}
    same = [c for c in rows if c.same]
    untested = [c for c in rows if c.outcome(alpha) == "untested"]
    vs = _against(rows)
    parts = []
    if groups["differs"]:
        parts.append(
            f"differ from {spec} beyond seed noise: "
            + "; ".join(f"{c.cell.label()} ({_effect(c)}){vs(c)}" for c in groups["differs"])
        )
    if groups["equivalent"]:
        parts.append(
            "equivalent to it within the margin: "
            + "; ".join(
                f"{c.cell.label()} (within ±{num(c.margin)}: Δ {num(c.stat.diff_mean, True)} {_interval(c)}, "
                f"TOST Holm-adjusted p={c.tost_adjusted:.3g}){vs(c)}"
                for c in groups["equivalent"]
            )
        )
    if groups["unresolved"]:
        margin = groups["unresolved"][0].margin
        parts.append(
            f"not resolved (neither a difference nor equivalence within ±{num(margin)}): "
            + "; ".join(_unresolved(c) + vs(c) for c in groups["unresolved"])
        )
    if same:
        parts.append(
            "identical to it (every seed, every metric equal to float tolerance: one computation): "
            + "; ".join(c.cell.label() + vs(c) for c in same)
        )
    parts += _withheld(rows, alpha, vs)
    if untested:
        parts.append(
            f"not tested (fewer than {MIN_PAIRS} seeds completed in both): "
            + "; ".join(f"{c.cell.label()} ({c.stat.n_pairs} paired){vs(c)}" for c in untested)
        )
    return "; ".join(parts) if parts else "no cell to compare"


def _against(rows: list[Comparison]):
    """A comparison's ` against <its baseline cell>` where the baseline is several cells (pairing), else ''."""
    several = len({id(c.base) for c in rows}) > 1
    return lambda c: f" against {c.base.label()}" if several else ""


def _withheld(rows: list[Comparison], alpha: float, vs) -> list[str]:
    """`not tested: the baseline formed it in 1 of 3 seeds: <cells>`, one part per reason (formation.withheld) and
    baseline cell (` against <it>` where the baseline is several cells)."""
    reasons: dict[tuple[str, str], list[str]] = {}
    for c in rows:
        if c.outcome(alpha) == "withheld":
            reasons.setdefault((vs(c), c.withheld), []).append(c.cell.label())
    return [f"not tested{against}: {why}: {'; '.join(cells)}" for (against, why), cells in reasons.items()]


def cannot_rank(table: Table, rows: list[Comparison]) -> list[str]:
    """The verdict's warning when every compared cell sits at a plateau of its task (Cell.plateaued: nothing
    learnt); else none. Cells still learning are ranked at their budget instead (budget.at_budget)."""
    compared = compared_cells(table, rows)
    if not compared or not all(c.plateaued() for c in compared):
        return []
    named = "; ".join(f"{c.label()}: {c.standing()}" for c in compared)
    return [
        f"**This sweep cannot rank these cells**: every compared cell sits at a plateau of its task, having learnt "
        f"nothing it measures ({named}). Their differences say where training stopped, not what each "
        f"configuration can do; a scale that separates them: {SCALE_GUIDE}.",
        "",
    ]


def compared_cells(table: Table, rows: list[Comparison]) -> list[Cell]:
    """The cells of the verdict's comparisons (each cell and its baseline), in the table's order."""
    ids = {id(c) for r in rows for c in (r.cell, r.base)}
    return [c for c in table.cells if id(c) in ids]


def unbracketed(table: Table) -> list[str]:
    """Under --select-lr, the cells whose selected rate sits at the edge of their grid (Cell.lr_edge): each is
    compared at a rate that may not be its best; and the cells with one rate only, which this report did not select
    (a study's final report over the runs its screens selected: their reports say whether each grid bracketed)."""
    edge = [c for c in table.cells if c.lr_edge in ("low", "high")] if table.select_lr else []
    only = [c for c in table.cells if c.lr_edge == "only"] if table.select_lr else []
    lines = []
    if edge:
        named = "; ".join(f"{c.label()}: {LR}={c.lr}, {edge_text(c)}" for c in edge)
        lines += [
            f"**Learning rates not bracketed** in {len(edge)} of {len(table.cells)} cells ({named}). Each is "
            "compared at the edge of the rates it was given, which may not be its best.",
            "",
        ]
    if only:
        named = "; ".join(f"{c.label()}: {LR}={c.lr}" for c in only)
        lines += [
            f"**One rate per cell, selected before this report** in {len(only)} of {len(table.cells)} cells "
            f"({named}): their runs share one rate, so nothing was selected or bracketed here; where the rate came "
            "from a screen, that screen's report says whether its grid bracketed it.",
            "",
        ]
    return lines


def pairing(table: Table, spec: str) -> list[str]:
    """The rule that pairs each cell with its baseline cell where `spec` matches several (`each cell against
    normalizer=softmax at its own model.output_gate`), and the cells no baseline cell pairs with; [] when neither."""
    pairs = baseline_pairs(spec)
    named = {k for k, _ in pairs}
    bases = [c for c in table.cells if is_baseline(c.key, pairs)]
    own = [k for k in table.group_by if k not in named and len({str(b.key[k]) for b in bases}) > 1]
    paired = {id(c) for c, _ in partners(table, spec)}
    alone = [c for c in table.cells if not is_baseline(c.key, pairs) and id(c) not in paired]
    lines = []
    if len(bases) > 1:
        lines.append(
            f"**Pairing**: each cell against {spec} at its own {' and '.join(own)} ({len(bases)} baseline cells; "
            "each comparison below names its own)."
        )
    if alone:
        keys = ", ".join(k for k in table.group_by if k not in named)
        lines.append(f"**Not compared**: no baseline cell has its {keys}: {'; '.join(c.label() for c in alone)}.")
    return [line for text in lines for line in (text, "")]


def verdict(table: Table) -> list[str]:
    """The Verdict section: what formed (formation.section), how cells pair with the baseline, its method in one
    paragraph, then one sentence per metric."""
    spec = baseline_of(table)
    head = ["## Verdict", "", *formation.section(table, spec)]
    if spec is None:
        why = f" The default is not taken: {table.no_default_baseline}." if table.no_default_baseline else ""
        return [
            *head,
            "No baseline: --baseline KEY=VALUE (e.g. normalizer=softmax) names the cell the others are tested against."
            + why,
        ]
    rows = comparisons(table, spec)
    if not rows:
        return [*head, *pairing(table, spec), f"No cell has a partner in {spec} to compare with."]
    n_tests = sum(c.tested() for c in rows)
    metrics = metrics_of(table)
    chosen = "" if table.baseline and table.baseline_given else " (the default; --baseline KEY=VALUE picks another)"
    margins = ", ".join(f"{m} ±{num(next(c.margin for c in rows if c.metric == m))}" for m in metrics)
    method = (
        f"Against {spec}{chosen}, on {', '.join(metrics)} ({table.which} parameters), from the seeds both "
        f"completed (from {MIN_PAIRS} pairs): *differ* where a paired t-test (scipy.stats.ttest_rel) rejects Δ = 0, "
        f"*equivalent* where two one-sided paired t-tests reject |Δ| >= the margin ({margins}; --margin "
        f"METRIC=VALUE sets one), each with Holm's correction over the {n_tests} (cell, metric) comparison(s) tested "
        f"at family-wise α = {table.alpha:g}; otherwise *not resolved*, with Δ's 95% interval, the smallest |Δ| these "
        f"seeds detect at {stats.POWER:.0%} power and the seeds the observed Δ needs (paired t-test at "
        f"α/{max(n_tests, 1)})."
    )
    refused = cannot_rank(table, rows)
    budget = [] if refused else at_budget(table, compared_cells(table, rows), metrics[0])
    lines = [*head, *pairing(table, spec), *refused, *budget, *unbracketed(table), method, ""]
    # a sentence and the metrics it holds for: a reason not to test (the baseline's formation) is often every metric's
    found: dict[str, list[str]] = {}
    for m in metrics:
        found.setdefault(_sentence([c for c in rows if c.metric == m], spec, table.alpha), []).append(m)
    return lines + [f"- **{', '.join(ms)}**: {sentence}." for sentence, ms in found.items()]
