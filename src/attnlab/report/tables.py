"""A sweep summary as tables: Markdown, LaTeX (booktabs) and tidy CSV."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from attnlab.report.cells import Cell, Table
from attnlab.report.load import LR
from attnlab.report.stats import MIN_PAIRS, SMALL_N

MAX_COLUMNS = 10  # columns of one Markdown/LaTeX table before it is split (--columns)
TEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def num(x: float, sign: bool = False) -> str:
    """3 significant figures throughout (an explicit + with `sign`); nan for a missing value."""
    return "nan" if x is None or not math.isfinite(x) else f"{x:+.3g}" if sign else f"{x:.3g}"


def _stat_text(cell: Cell, metric: str, pm: str) -> str:
    s, done = cell.stats[metric], cell.count("completed")
    if s.n == 0:
        return "–"
    text = f"{num(s.mean)} {pm} {num(s.std)} [{num(s.ci_low)}, {num(s.ci_high)}]" if s.n > 1 else num(s.mean)
    return (
        text
        + (f" (n={s.n})" if s.n != done else "")
        + (" low n" if s.low_n else "")
        + (" below chance" if cell.below_chance(metric) else " ≈chance" if cell.near_chance(metric) else "")
    )


def _diff_text(cell: Cell, metric: str) -> str:
    s = cell.stats[metric]
    if cell.is_baseline:
        return "baseline"
    if s.n_pairs == 0:
        return "no paired seeds"
    if cell.identical:
        return "identical"
    if s.n_pairs < MIN_PAIRS:  # no test: the differences themselves, seed by seed
        each = ", ".join(f"{d:+.3g}" for d in s.diffs.values())
        return f"{s.diff_mean:+.3g} ({s.n_pairs} pair{'s' * (s.n_pairs > 1)}: {each}; no test)"
    return f"{s.diff_mean:+.3g}, p={s.p:.3g}" + (", within seed noise" if s.within_noise else "")


def metric_chunks(table: Table, max_columns: int = MAX_COLUMNS) -> list[list[str]]:
    """The metrics of each printed table: all in one when it has at most `max_columns` columns, else one
    table per metric group (the name before "/"), a group cut into tables that fit."""
    fixed = len(table.group_by) + table.select_lr + len(table.statuses)  # keys, n and the other statuses
    per_metric = 2 if table.baseline else 1  # its value and its Δ
    if fixed + per_metric * len(table.metrics) <= max_columns:
        return [table.metrics]
    room = max(1, (max_columns - fixed) // per_metric)
    groups: dict[str, list[str]] = {}
    for m in table.metrics:
        groups.setdefault(m.split("/", 1)[0] if "/" in m else "", []).append(m)
    return [g[i : i + room] for g in groups.values() for i in range(0, len(g), room)]


def display(table: Table, pm: str = "±", metrics: list[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """The table (of `metrics`, default all) as header + rows of strings, for the Markdown and LaTeX writers."""
    statuses, metrics = table.statuses, table.metrics if metrics is None else metrics
    header = [*table.group_by, *([f"{LR} (selected)"] if table.select_lr else []), "n", *statuses[1:], *metrics]
    if table.baseline:
        header += [f"Δ {m} vs {table.baseline}" for m in metrics]
    rows = []
    for c in table.cells:
        row = [str(v) for v in c.key.values()] + ([str(c.lr)] if table.select_lr else [])
        row += [str(c.count(s)) for s in statuses]  # n = completed
        row += [_stat_text(c, m, pm) for m in metrics]
        if table.baseline:
            row += [_diff_text(c, m) for m in metrics]
        rows.append(row)
    return header, rows


def _explain(table: Table) -> list[str]:
    ns = [s.n for c in table.cells for s in c.stats.values() if s.n]
    lines = [
        f"Metrics of the {table.which} parameters over the completed runs of each cell: mean ± std across "
        f"seeds (ddof=1) [95% CI of the mean: percentile bootstrap from n={SMALL_N}; below, marked 'low n', "
        "the Student-t interval, none for n=1]; n counts completed runs "
        f"(here {min(ns, default=0)} to {max(ns, default=0)} per cell)."
    ]
    if table.baseline:
        lines.append(
            f"Δ: paired difference to {table.baseline} on the seeds both completed, paired t-test p from "
            f"{MIN_PAIRS} pairs (below, the differences and no test); "
            "'within seed noise' when |mean Δ| <= std of Δ across seeds."
        )
    if table.select_lr:
        lines.append(
            f"Learning rate selected per cell by the best mean {table.select_by} (validation, so the test "
            "metrics stay unseen): each normalizer is compared at the rate that suits it. Rates at which "
            "a run diverged or failed are taken only when no other rate is clean."
        )
        for c in table.cells:
            scores = ", ".join(f"{lr}: {num(v)}" for lr, v in sorted(c.lr_scores.items(), key=lambda kv: str(kv[0])))
            lines.append(f"- {c.label()}: {LR}={c.lr} ({table.select_by} by rate: {scores}){edge_text(c, ' — ')}")
    return lines


def edge_text(c: Cell, lead: str = "") -> str:
    """`lead` + where a selected rate sits at the edge of its cell's grid (Cell.lr_edge), or '' when the grid
    brackets it."""
    grid = f"{num(c.lr_grid[0])} to {num(c.lr_grid[-1])}" if c.lr_grid else ""
    if c.lr_edge == "only":
        return f"{lead}the only rate of its grid: no rate was selected against another"
    if c.lr_edge in ("low", "high"):
        side, beyond = ("lowest", "lower") if c.lr_edge == "low" else ("highest", "higher")
        return (
            f"{lead}at the {c.lr_edge} edge of its grid ({side} of {grid}): not bracketed, a {beyond} rate may be "
            "better (experiments/bracket_lrs.py extends the grid)"
        )
    return ""


def markdown_tables(table: Table, max_columns: int = MAX_COLUMNS) -> list[str]:
    """The tables section of report.md: its heading, how to read it, the table(s) (see metric_chunks)."""
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    out = [f"## Tables ({table.which} parameters)", "", *_explain(table)]
    chunks = metric_chunks(table, max_columns)
    for i, metrics in enumerate(chunks):
        header, rows = display(table, metrics=metrics)
        out += ["", f"Table {i + 1} of {len(chunks)}: {', '.join(metrics)}"] if len(chunks) > 1 else [""]
        out += ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return out


def tex_escape(s: str) -> str:
    return "".join(TEX_ESCAPES.get(ch, ch) for ch in s)


def to_latex(table: Table, max_columns: int = MAX_COLUMNS) -> str:
    """The table as booktabs tabulars (needs \\usepackage{booktabs}), one per metric_chunks entry."""
    cell = lambda s: tex_escape(s).replace("PLUSMINUS", r"$\pm$").replace("Δ", r"$\Delta$").replace("≈", r"$\approx$")  # noqa: E731
    n_keys = len(table.group_by) + table.select_lr
    tabulars = []
    for metrics in metric_chunks(table, max_columns):
        header, rows = display(table, pm="PLUSMINUS", metrics=metrics)
        lines = [
            f"% {', '.join(metrics)}",
            r"\begin{tabular}{" + "l" * n_keys + "r" * (len(header) - n_keys) + "}",
            r"\toprule",
            " & ".join(map(cell, header)) + r" \\",
            r"\midrule",
        ]
        lines += [" & ".join(map(cell, r)) + r" \\" for r in rows]
        tabulars.append("\n".join([*lines, r"\bottomrule", r"\end{tabular}"]) + "\n")
    return "\n\\medskip\n\n".join(tabulars)


def write_csv(table: Table, path: Path) -> None:
    """Tidy CSV, one row per cell and metric; floats as repr so they read back exactly."""
    rows = table.rows()
    fields = list(rows[0]) if rows else [*table.group_by, "metric"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r[k] is None else repr(r[k]) if isinstance(r[k], float) else r[k] for k in fields})
