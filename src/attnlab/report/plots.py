"""Learning curves of a sweep: per-cell mean over seeds with a ±std band, drawn with matplotlib's Agg."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attnlab.report.cells import Table
from attnlab.report.load import LR, Run, has_scalars, scalars
from attnlab.run.record import FINISHED  # the runs whose curves are drawn; a diverged curve shows where it broke


def run_scalars(runs: list[Run], cache: dict | None) -> list[dict[str, dict[int, float]]]:
    """read_scalars of each run whose curve is drawn, read once per path into `cache`."""
    cache = {} if cache is None else cache
    drawn = [r for r in runs if r.status in FINISHED]
    for r in drawn:
        if r.path not in cache:
            cache[r.path] = scalars(r.path)
    return [cache[r.path] for r in drawn]


def logged(runs: list[Run]) -> list[Run]:
    """The runs with a TensorBoard event file (or its records' scalars): those whose curves can be read without a
    warning."""
    return [r for r in runs if has_scalars(r.path)]


def _by_step(runs: list[Run], tag: str, cache: dict | None) -> tuple[list[int], list[np.ndarray]]:
    """The steps at which any run logged `tag`, and the runs' finite values at each."""
    series = [curves.get(tag, {}) for curves in run_scalars(runs, cache)]
    steps = sorted(set().union(*series)) if series else []
    return steps, [np.array([x[s] for x in series if s in x and math.isfinite(x[s])]) for s in steps]


def scalar_tags(runs: list[Run], cache: dict | None = None) -> list[str]:
    """Every scalar tag that a run whose curve is drawn (completed or diverged) logged."""
    return sorted({tag for curves in run_scalars(runs, cache) for tag in curves})


def curve(runs: list[Run], tag: str, cache: dict | None = None, geometric: bool = False) -> tuple[np.ndarray, ...]:
    """steps, mean, std (ddof=1; 0 for a single run) and run count across seeds at each step.

    geometric: the mean and std are those of log(value) over the positive values (exp of the mean is the
    geometric mean; the band is gmean ×/÷ exp(std)), the count is that of the positive values.
    """
    steps, values = _by_step(runs, tag, cache)
    stats = []
    for v in values:
        v = np.log(v[v > 0]) if geometric else v
        stats.append((v.mean() if len(v) else np.nan, v.std(ddof=1) if len(v) > 1 else 0.0, len(v)))
    mean, std, n = (np.array(col) for col in zip(*stats)) if stats else (np.array([]),) * 3
    return np.array(steps), (np.exp(mean) if geometric else mean), std, n


def logged_tag(table: Table, tag: str, cache: dict | None = None) -> bool:
    """Whether a run whose curve is drawn logged `tag`: draw_curves draws it."""
    return any(_by_step(c.runs, tag, cache)[0] for c in table.cells)


LEGEND_INSIDE_MAX = 8  # curves per plot whose legend still fits inside the axes


def draw_curves(table: Table, tag: str, cache: dict | None = None, log_y: bool = False):
    """A Figure with a mean line and a ±std band per cell; None when no run logged the tag.

    On a log y axis the line is the geometric mean and the band its geometric spread, gmean ×/÷ exp(std of
    log), which stays positive; values <= 0 cannot be drawn there: they are left out and counted in the title.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cache = {} if cache is None else cache  # each run's scalars read once for the lines and the count
    many = len(table.cells) > LEGEND_INSIDE_MAX
    fig = Figure(figsize=(11, max(4.2, 0.2 * len(table.cells))) if many else (7, 4.2))
    FigureCanvasAgg(fig)  # Agg explicitly, without touching pyplot's global backend
    ax = fig.add_subplot()
    if len(table.cells) > 10:  # the default cycle repeats after 10 colours
        from matplotlib import colormaps

        ax.set_prop_cycle(color=colormaps["tab20"].colors)
    drawn, dropped = False, 0
    for c in table.cells:
        steps, mean, std, n = curve(c.runs, tag, cache, geometric=log_y)
        if log_y:
            dropped += sum(int((v <= 0).sum()) for v in _by_step(c.runs, tag, cache)[1])
        if len(steps):
            label = c.label() + (f", {LR}={c.lr}" if table.select_lr else "") + f" ({n.max()} runs)"
            (line,) = ax.plot(steps, mean, label=label, marker="o" if len(steps) < 30 else None, markersize=3)
            lo, hi = (mean / np.exp(std), mean * np.exp(std)) if log_y else (mean - std, mean + std)
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            drawn = True
    if not drawn:
        return None
    title = f"{tag} (mean ± std over seeds)"
    if log_y:
        ax.set_yscale("log")
        title = f"{tag} (geometric mean ×/÷ geometric std over seeds)"
        title += f"\n{dropped} value(s) <= 0 left out" if dropped else ""
    ax.set(title=title, xlabel="step", ylabel=tag + (" (log scale)" if log_y else ""))
    if many:  # a legend of more lines than this covers the curves: put it beside the axes
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_curves(table: Table, tag: str, path: Path, cache: dict | None = None, log_y: bool = False) -> bool:
    """Save draw_curves' figure as a PNG at `path`; False when no run logged the tag."""
    fig = draw_curves(table, tag, cache, log_y)
    if fig is not None:
        fig.savefig(path, dpi=110)
    return fig is not None
