"""A report directory: report.md, report.tex, report.csv and one PNG per curve."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Iterable

from attnlab.report import lengths, plots, provenance
from attnlab.report.cells import Table
from attnlab.report.comparison import comparison, title
from attnlab.report.tables import MAX_COLUMNS, markdown_tables, to_latex, write_csv
from attnlab.report.verdict import verdict


@dataclasses.dataclass(frozen=True)
class Report:
    """What a report says, before anything is written: report.md's text, the curves it shows, its length table."""

    markdown: str
    curves: list[str]  # the scalar tags drawn: those a run logged
    lengths: tuple[str | None, list[int], list[dict]]  # lengths.length_stats


def curve_file(tag: str) -> str:
    return f"curve_{tag.replace('/', '_')}.png"


def compose(
    table: Table, curves: Iterable[str] = ("val/loss", "train/loss"), cache: dict | None = None, max_columns=MAX_COLUMNS
) -> Report:
    """The report of `table` with `curves` (scalar tags; a tag no run logged gets a note instead of a curve);
    `cache` maps run paths to their read scalars."""
    cache = table.cache if cache is None else cache
    drawn = [tag for tag in curves or () if plots.logged_tag(table, tag, cache)]
    notes = [f"No run logged the scalar {tag}; no curve drawn." for tag in curves or () if tag not in drawn]
    length_stats = lengths.length_stats(table)  # task.test_lengths: nothing without them
    text = to_markdown(table, map(curve_file, drawn), notes, max_columns) + "\n".join(
        lengths.lines(table, length_stats)
    )
    return Report(text, drawn, length_stats)


def write_report(
    table: Table,
    out_dir,
    curves: Iterable[str] = ("val/loss", "train/loss"),
    log_y: Iterable[str] = (),
    cache: dict | None = None,
    max_columns: int = MAX_COLUMNS,
) -> list[Path]:
    """report.md, report.tex, report.csv, curve_<tag>.png (and the length section's files, report.lengths) in
    `out_dir`; returns the files written.

    `curves` are scalar tags (a tag no run logged gets a note); `log_y` holds fnmatch patterns (e.g.
    "grad_norm/*") of the curves drawn on a log y axis; `cache` maps run paths to their read scalars.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = table.cache if cache is None else cache
    report = compose(table, curves, cache, max_columns)
    images = [out / curve_file(tag) for tag in report.curves]
    for tag, path in zip(report.curves, images):
        plots.plot_curves(table, tag, path, cache, log_y=any(fnmatchcase(tag, pat) for pat in log_y))
    (out / "report.md").write_text(report.markdown)
    (out / "report.tex").write_text(to_latex(table, max_columns))
    write_csv(table, out / "report.csv")
    return [
        out / "report.md",
        out / "report.tex",
        out / "report.csv",
        *images,
        *lengths.write(table, report.lengths, out),
    ]


def to_markdown(
    table: Table, images: Iterable[str] = (), notes: Iterable[str] = (), max_columns: int = MAX_COLUMNS
) -> str:
    """report.md: title, progress, the runs still running, provenance, verdict, comparison, the tables
    (tables.markdown_tables), completeness, notes, curve images."""
    out = [
        title(table),
        "",
        *([table.progress, ""] if table.progress else []),
        *([*table.live, ""] if table.live else []),
        *(lines + [""] if (lines := provenance.section(table)) else []),
        *verdict(table),
        "",
        *comparison(table),
        "",
        *markdown_tables(table, max_columns),
    ]
    out += ["", *table.completeness(), *table.notes, *notes]
    out += [""] + [f"![{Path(name).stem}]({name})" for name in images]
    return "\n".join(folded(out)).rstrip() + "\n"


# report.md is printed as written (attnlab-report): its prose in lines a terminal shows whole, the repository's width.
WIDTH = 120
UNFOLDED = ("|", "#", "![", "```")  # tables, headings, images, code: one line each in Markdown


def folded(lines: list[str]) -> list[str]:
    """Each prose or list line longer than WIDTH folded at spaces, a list item's continuation under its text:
    Markdown renders the folded lines as the one they were."""
    out = []
    for line in lines:
        if len(line) <= WIDTH or line.lstrip().startswith(UNFOLDED):
            out.append(line)
            continue
        indent = " " * len(re.match(r"\s*(?:(?:[-*]|\d+\.)\s+)?", line).group(0))
        out += textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return out
