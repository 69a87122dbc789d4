"""Length generalisation in a report: the headline metric at each test length (task.test_lengths, the
test_len/<T>/<metric> entries of metrics.json) per cell, as a table (mean ± std [CI] over seeds, as in the
other tables) and a curve against length (lengths.png, lengths.csv)."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from attnlab.report.cells import Cell, Table
from attnlab.report.load import LR, Run
from attnlab.report.stats import Stat, cell_stat
from attnlab.report.tables import num

LENGTH_KEY = re.compile(r"^test_len/(\d+)/(.+)$")


def _records(runs: list[Run], which: str) -> list[dict]:
    return [r.final if which == "final" else r.best for r in runs if r.status == "completed"]


def lengths_and_headline(table: Table) -> tuple[list[int], str | None]:
    """The test lengths the completed runs were evaluated at, ascending, and the headline metric they report."""
    found: dict[str, set[int]] = {}
    for record in _records([r for c in table.cells for r in c.runs], table.which):
        for key in record:
            if m := LENGTH_KEY.match(key):
                found.setdefault(m.group(2), set()).add(int(m.group(1)))
    headlines = [r.headline.split("/", 1)[1] for c in table.cells for r in c.runs if r.headline]
    metric = next((h for h in headlines if h in found), None)
    return (sorted(found[metric]) if metric else []), metric


def length_stats(table: Table) -> tuple[str | None, list[int], list[dict]]:
    """(headline metric, lengths, per cell {length: Stat}): stats.cell_stat of test_len/<T>/<metric>, its
    bootstrap intervals drawn with the table's n_boot and seed (attnlab-report --n-boot, --seed)."""
    lengths, metric = lengths_and_headline(table)
    per_cell = [
        {t: cell_stat(c.runs, f"test_len/{t}/{metric}", table.which, table.n_boot, table.seed) for t in lengths}
        for c in table.cells
    ]
    return metric, lengths, per_cell


def _text(s: Stat) -> str:
    if s.n == 0:
        return "–"
    return f"{num(s.mean)} ± {num(s.std)} [{num(s.ci_low)}, {num(s.ci_high)}]" if s.n > 1 else num(s.mean)


def _label(table: Table, c: Cell) -> str:
    return c.label() + (f", {LR}={c.lr}" if table.select_lr else "")


def draw(table: Table, metric: str, lengths: list[int], per_cell: list[dict]):
    """A Figure: per cell, the mean over seeds against length with its CI band (log2 length axis)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for c, stats in zip(table.cells, per_cell):
        xs = [t for t in lengths if stats[t].n]
        if not xs:
            continue
        (line,) = ax.plot(
            xs,
            [stats[t].mean for t in xs],
            marker="o",
            markersize=3,
            label=f"{_label(table, c)} ({max(stats[t].n for t in xs)} runs)",
        )
        band = [t for t in xs if math.isfinite(stats[t].ci_low)]
        if band:
            ax.fill_between(
                band,
                [stats[t].ci_low for t in band],
                [stats[t].ci_high for t in band],
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(t) for t in lengths])
    ax.minorticks_off()
    ax.set(
        title=f"test {metric} against length (mean over seeds, 95% CI band)",
        xlabel="test length",
        ylabel=f"test {metric}",
    )
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def lines(table: Table, stats: tuple[str | None, list[int], list[dict]]) -> list[str]:
    """Markdown lines of the length section of `stats` (length_stats(table)); none when no run was evaluated at
    other lengths."""
    metric, lengths, per_cell = stats
    if not lengths:
        return []
    header = [*table.group_by, *([f"{LR} (selected)"] if table.select_lr else []), *map(str, lengths)]
    rows = [
        [str(v) for v in c.key.values()] + ([str(c.lr)] if table.select_lr else []) + [_text(s[t]) for t in lengths]
        for c, s in zip(table.cells, per_cell)
    ]
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    return [
        "",
        f"## Length generalisation: test {metric} per test length ({table.which} parameters)",
        "",
        f"Columns: the length T of task.test_lengths (test_len/T/{metric}); each cell: mean ± std across "
        "seeds [95% CI of the mean], over its completed runs, as in the tables above.",
        "",
        "| " + " | ".join(map(esc, header)) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(map(esc, r)) + " |" for r in rows),
        "",
        "![lengths](lengths.png)",
        "",
    ]


def write(table: Table, stats: tuple[str | None, list[int], list[dict]], out_dir: Path) -> list[Path]:
    """lengths.csv and lengths.png of `stats` (length_stats(table)) in `out_dir`; the files written (none when no
    run was evaluated at other lengths)."""
    metric, lengths, per_cell = stats
    if not lengths:
        return []
    out = Path(out_dir)
    with open(out / "lengths.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*table.group_by, "metric", "length", "n", "mean", "std", "ci_low", "ci_high"])
        for c, cell_stats in zip(table.cells, per_cell):
            for t in lengths:
                s = cell_stats[t]
                w.writerow([*c.key.values(), metric, t, s.n, s.mean, s.std, s.ci_low, s.ci_high])
    draw(table, metric, lengths, per_cell).savefig(out / "lengths.png", dpi=110)
    return [out / "lengths.csv", out / "lengths.png"]
