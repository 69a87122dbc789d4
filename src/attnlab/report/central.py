"""One verdict table over several studies (`attnlab-report --verdicts FILE...`): per study and compared cell, its
verdict against its baseline on the study's headline metric and the seeds in which what it asks about formed."""

from __future__ import annotations

from attnlab.report import formation
from attnlab.report.cells import Cell, Table
from attnlab.report.paired import Comparison, baseline_of, comparisons, metrics_of
from attnlab.report.tables import num

HEADER = ["study", "cell", "against", "metric", "verdict", "formed"]


def outcome_text(c: Comparison, alpha: float) -> str:
    """`differs: Δ +0.16`, `equivalent within ±0.01: Δ ...`, `not resolved: Δ ...`, `identical`, `not tested: why`."""
    delta = f"Δ {num(c.stat.diff_mean, True)}"
    return {
        "differs": f"differs: {delta} (Holm-adjusted p={c.adjusted:.3g})",
        "equivalent": f"equivalent within ±{num(c.margin)}: {delta}",
        "unresolved": f"not resolved: {delta} (Holm-adjusted p={c.adjusted:.3g})",
        "identical": "identical",
        "withheld": f"not tested: {c.withheld}",
        "untested": f"not tested: {c.stat.n_pairs} pair(s)",
    }[c.outcome(alpha)]


def formed_text(table: Table, cell: Cell) -> str:
    """`test/x>=0.3: 2 of 3 seeds` per --formed condition; `–` without one."""
    counts = [(cond.text, *formation.count(cond, cell, table)) for cond in table.formed]
    return "; ".join(f"{text}: {met} of {n} seeds" for text, met, n in counts) or "–"


def rows(study: str, table: Table) -> list[list[str]]:
    """The study's rows: each baseline cell, then each cell compared with one, on the first verdict metric; without a
    baseline, each cell and what formed in it, or one row counting the cells where nothing was declared to form."""
    spec = baseline_of(table)
    if spec is None and not table.formed:  # a table of values, nothing compared or formed: one row says so
        return [[study, f"{len(table.cells)} cells", "–", "–", "no baseline", "–"]]
    if spec is None:  # nothing compared: each cell still says what formed in it
        return [[study, cell.label(), "–", "–", "no baseline", formed_text(table, cell)] for cell in table.cells]
    metric = metrics_of(table)[0]
    compared = [c for c in comparisons(table, spec) if c.metric == metric]
    bases = list({id(c.base): c.base for c in compared}.values())
    out = [[study, b.label(), "–", metric, "the baseline", formed_text(table, b)] for b in bases]
    for c in compared:
        verdict = outcome_text(c, table.alpha)
        out.append([study, c.cell.label(), c.base.label(), metric, verdict, formed_text(table, c.cell)])
    return out


def markdown(table_rows: list[list[str]]) -> list[str]:
    """A Markdown table of HEADER and the rows."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return lines + ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table_rows]
