"""Writers of a sweep report: Markdown, LaTeX (booktabs), CSV, and learning curves with seed bands."""

from __future__ import annotations

import csv
import math
from fnmatch import fnmatch
from pathlib import Path
from typing import Iterable

import numpy as np

from attnlab.report import LR, Cell, Run, Table

CURVE_STATUSES = ("completed", "diverged")  # runs whose curves are drawn; a diverged curve shows where it broke
TEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
               "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _num(x: float) -> str:
    return "nan" if x is None or not math.isfinite(x) else f"{x:.4g}"


def _stat_text(cell: Cell, metric: str, pm: str) -> str:
    s, done = cell.stats[metric], cell.count("completed")
    if s.n == 0:
        return "–"
    text = f"{_num(s.mean)} {pm} {_num(s.std)} [{_num(s.ci_low)}, {_num(s.ci_high)}]" if s.n > 1 else _num(s.mean)
    return text + (f" (n={s.n})" if s.n != done else "")


def _diff_text(cell: Cell, metric: str) -> str:
    s = cell.stats[metric]
    if cell.is_baseline:
        return "baseline"
    if s.n_pairs == 0:
        return "no paired seeds"
    if s.n_pairs == 1:
        return f"{s.diff_mean:+.4g} (1 pair)"
    return f"{s.diff_mean:+.4g}, p={s.p:.3g}" + (", within seed noise" if s.within_noise else "")


def display(table: Table, pm: str = "±") -> tuple[list[str], list[list[str]]]:
    """The table as header + rows of strings, shared by the Markdown and LaTeX writers."""
    statuses = table.statuses
    header = [*table.group_by, *([f"{LR} (selected)"] if table.select_lr else []), "n", *statuses[1:], *table.metrics]
    if table.baseline:
        header += [f"Δ {m} vs {table.baseline}" for m in table.metrics]
    rows = []
    for c in table.cells:
        row = [str(v) for v in c.key.values()] + ([str(c.lr)] if table.select_lr else [])
        row += [str(c.count(s)) for s in statuses]  # n = completed
        row += [_stat_text(c, m, pm) for m in table.metrics]
        if table.baseline:
            row += [_diff_text(c, m) for m in table.metrics]
        rows.append(row)
    return header, rows


def _explain(table: Table) -> list[str]:
    lines = [f"Metrics of the {table.which} parameters over the completed runs of each cell: mean ± std across "
             "seeds (ddof=1) [95% percentile-bootstrap CI of the mean]; n counts completed runs."]
    if table.baseline:
        lines.append(f"Δ: paired difference to {table.baseline} on the seeds both completed, paired t-test p; "
                     "'within seed noise' when |mean Δ| <= std of Δ across seeds.")
    if table.select_lr:
        lines.append(f"Learning rate selected per cell by the best mean {table.select_by} (validation, so the test "
                     "metrics stay unseen): each normalizer is compared at the rate that suits it. Rates at which "
                     "a run diverged or failed are taken only when no other rate is clean.")
        for c in table.cells:
            scores = ", ".join(f"{lr}: {_num(v)}" for lr, v in sorted(c.lr_scores.items(), key=lambda kv: str(kv[0])))
            lines.append(f"- {c.label()}: {LR}={c.lr} ({table.select_by} by rate: {scores})")
    return lines


def to_markdown(table: Table, images: Iterable[Path] = (), notes: Iterable[str] = ()) -> str:
    """The report as Markdown: explanation, table, completeness, notes, curve images."""
    header, rows = display(table)
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    out = [f"# Sweep report ({table.which})", "", *_explain(table), "",
           "| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    out += ["", *table.completeness(), *table.notes, *notes]
    out += [""] + [f"![{p.stem}]({p.name})" for p in images]
    return "\n".join(out).rstrip() + "\n"


def tex_escape(s: str) -> str:
    return "".join(TEX_ESCAPES.get(ch, ch) for ch in s)


def to_latex(table: Table) -> str:
    """The table as a booktabs tabular (needs \\usepackage{booktabs})."""
    header, rows = display(table, pm="PLUSMINUS")
    cell = lambda s: tex_escape(s).replace("PLUSMINUS", r"$\pm$").replace("Δ", r"$\Delta$")  # noqa: E731
    n_keys = len(table.group_by) + table.select_lr
    lines = [r"\begin{tabular}{" + "l" * n_keys + "r" * (len(header) - n_keys) + "}", r"\toprule",
             " & ".join(map(cell, header)) + r" \\", r"\midrule"]
    lines += [" & ".join(map(cell, r)) + r" \\" for r in rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_csv(table: Table, path: Path) -> None:
    """Tidy CSV, one row per cell and metric; floats as repr so they read back exactly."""
    rows = table.rows()
    fields = list(rows[0]) if rows else [*table.group_by, "metric"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r[k] is None else repr(r[k]) if isinstance(r[k], float) else r[k] for k in fields})


def read_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of a run, read with TensorBoard's own EventAccumulator (every scalar kept)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "histograms": 1, "images": 1, "tensors": 1})
    acc.Reload()
    # A step written twice (a resumed run) keeps its last value.
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags().get("scalars", [])}


def curve(runs: list[Run], tag: str, cache: dict | None = None) -> tuple[np.ndarray, ...]:
    """steps, mean, std (ddof=1; 0 for a single run) and run count across seeds at each step."""
    cache = {} if cache is None else cache
    for r in runs:
        if r.status in CURVE_STATUSES and r.path not in cache:
            cache[r.path] = read_scalars(r.path)
    series = [cache[r.path].get(tag, {}) for r in runs if r.status in CURVE_STATUSES]
    steps = sorted(set().union(*series)) if series else []
    stats = []
    for s in steps:
        v = np.array([x[s] for x in series if s in x and math.isfinite(x[s])])
        stats.append((v.mean() if len(v) else np.nan, v.std(ddof=1) if len(v) > 1 else 0.0, len(v)))
    mean, std, n = (np.array(col) for col in zip(*stats)) if stats else (np.array([]),) * 3
    return np.array(steps), mean, std, n


def draw_curves(table: Table, tag: str, cache: dict | None = None, log_y: bool = False):
    """A Figure with a mean line and a ±std band per cell; None when no run logged the tag."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2))
    FigureCanvasAgg(fig)  # Agg explicitly, without touching pyplot's global backend
    ax = fig.add_subplot()
    if len(table.cells) > 10:  # the default cycle repeats after 10 colours
        from matplotlib import colormaps
        ax.set_prop_cycle(color=colormaps["tab20"].colors)
    drawn = False
    for c in table.cells:
        steps, mean, std, n = curve(c.runs, tag, cache)
        if len(steps):
            label = c.label() + (f", {LR}={c.lr}" if table.select_lr else "") + f" ({n.max()} runs)"
            (line,) = ax.plot(steps, mean, label=label, marker="o" if len(steps) < 30 else None, markersize=3)
            ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
            drawn = True
    if not drawn:
        return None
    if log_y:  # gradient norms span decades; a band reaching below 0 is clipped, not dropped
        ax.set_yscale("log", nonpositive="clip")
    ax.set(title=f"{tag} (mean ± std over seeds)", xlabel="step", ylabel=tag + (" (log scale)" if log_y else ""))
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_curves(table: Table, tag: str, path: Path, cache: dict | None = None, log_y: bool = False) -> bool:
    """Save draw_curves' figure as a PNG at `path`; False when no run logged the tag."""
    fig = draw_curves(table, tag, cache, log_y)
    if fig is not None:
        fig.savefig(path, dpi=110)
    return fig is not None


def write_report(table: Table, out_dir, curves: Iterable[str] = ("val/loss", "train/loss"),
                 log_y: Iterable[str] = ()) -> list[Path]:
    """report.md, report.tex, report.csv and curve_<tag>.png in `out_dir`; returns the files written.

    `log_y` holds fnmatch patterns (e.g. "grad_norm/*") of the curves drawn on a log y axis.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images, notes, cache = [], [], {}
    for tag in curves or ():
        path = out / f"curve_{tag.replace('/', '_')}.png"
        if plot_curves(table, tag, path, cache, log_y=any(fnmatch(tag, pat) for pat in log_y)):
            images.append(path)
        else:
            notes.append(f"No run logged the scalar {tag}; no curve drawn.")
    (out / "report.md").write_text(to_markdown(table, images, notes))
    (out / "report.tex").write_text(to_latex(table))
    write_csv(table, out / "report.csv")
    return [out / "report.md", out / "report.tex", out / "report.csv", *images]
