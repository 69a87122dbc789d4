"""Learning curves of a sweep: per-cell mean over seeds with a ±std band, drawn with matplotlib's Agg."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attnlab.report.cells import Table
from attnlab.report.load import LR, Run, read_scalars

CURVE_STATUSES = ("completed", "diverged")  # runs whose curves are drawn; a diverged curve shows where it broke


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
