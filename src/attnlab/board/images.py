"""Attention maps as readable RGB images: one panel per head, viridis, labelled, with a colour bar."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from attnlab import checks

SCALES = ("row", "log", "max")
PANEL_INCHES, DPI = 2.6, 100  # ≥ 200 px per head panel
LOG_FLOOR = 1e-4  # weights below this share the bottom colour in log scale


def check_scale(scale: str) -> str:
    """The trainer.attn_map_scale value, or a ValueError naming what is allowed."""
    return checks.choice("trainer.attn_map_scale", scale, SCALES)


def scaled(map_NTS: np.ndarray, scale: str) -> tuple[np.ndarray, float, float, str]:
    """(values to draw, colour-bar min, max, colour-bar label) of one layer's maps under `scale`.

    row: each query row divided by its own max (diffuse rows show their structure);
    log: log10 of the weight, floored at 1e-4; max: each head divided by its largest weight.
    """
    w_NTS = np.asarray(map_NTS, np.float64)
    if scale == "row":
        return w_NTS / np.maximum(w_NTS.max(-1, keepdims=True), 1e-12), 0.0, 1.0, "weight / row max"
    if scale == "log":
        return np.log10(np.maximum(w_NTS, LOG_FLOOR)), np.log10(LOG_FLOOR), 0.0, "log10 weight"
    return w_NTS / np.maximum(w_NTS.max((-2, -1), keepdims=True), 1e-12), 0.0, 1.0, "weight / head max"


MAX_LABELLED = 32  # up to this many positions, the axes name each position's character (a text task)


def char_labels(task, tokens_T) -> list[str] | None:
    """One visible label per position (space ␣, newline ↵, tab →) for a short shown text example; None otherwise."""
    tokens_T = np.asarray(tokens_T).ravel()
    if not task.is_text or len(tokens_T) > MAX_LABELLED:
        return None
    visible = {" ": "␣", "\n": "↵", "\t": "→", "\r": "␍", "": "·"}
    return [visible.get(c, c) for c in (task.decode(np.asarray([t])) for t in tokens_T)]


def render(map_NTS: np.ndarray, scale: str, title: str, labels: list[str] | None = None, first_head: int = 0):
    """A matplotlib Figure: heads side by side, titled `head h` (from `first_head`), queries down, keys across,
    one colour bar; `labels` (one per position) name the query and key ticks."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    values_NTS, lo, hi, label = scaled(map_NTS, scale)
    n = values_NTS.shape[0]
    fig = Figure(figsize=(PANEL_INCHES * n + 1.0, PANEL_INCHES + 0.6), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    for h, (ax, v_TS) in enumerate(zip(axes, values_NTS)):
        image = ax.imshow(v_TS, cmap="viridis", vmin=lo, vmax=hi, interpolation="nearest", aspect="equal")
        ax.set_title(f"head {first_head + h}", fontsize=9)
        ax.set_xlabel("key", fontsize=8)
        ax.tick_params(labelsize=7)
        if labels is not None and len(labels) == v_TS.shape[-1] == v_TS.shape[0]:
            ticks = np.arange(len(labels))
            ax.set_xticks(ticks, labels, fontsize=6, fontfamily="monospace")
            ax.set_yticks(ticks, labels, fontsize=6, fontfamily="monospace")
            continue
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("query", fontsize=8)
    fig.colorbar(image, ax=list(axes), shrink=0.9).set_label(label, fontsize=8)
    fig.suptitle(title, fontsize=9)
    return fig


def to_rgb(fig) -> np.ndarray:
    """An Agg-rendered figure as a uint8 (H, W, 3) array."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


MAX_SIDE = 256  # pixels per head panel side at most: a 1024-token map is drawn from 4×4 block means


def block_mean(map_NTS: np.ndarray, max_side: int = MAX_SIDE) -> tuple[np.ndarray, int]:
    """(map averaged over f×f blocks, f) with f = ceil(max(T, S) / max_side); the last block of an axis
    may be shorter and is averaged over what it holds. f = 1 returns the map unchanged."""
    w_NTS = np.asarray(map_NTS, np.float64)
    f = max(1, -(-max(w_NTS.shape[-2:]) // max_side))
    if f == 1:
        return w_NTS, 1
    rows, cols = np.arange(0, w_NTS.shape[-2], f), np.arange(0, w_NTS.shape[-1], f)
    sums_NIJ = np.add.reduceat(np.add.reduceat(w_NTS, rows, axis=-2), cols, axis=-1)
    counts_IJ = np.outer(np.diff(np.append(rows, w_NTS.shape[-2])), np.diff(np.append(cols, w_NTS.shape[-1])))
    return sums_NIJ / counts_IJ, f


class Figures:
    """One figure per layer, kept and drawn again with the next eval step's map: its layout is solved once
    (constrained layout was ~60% of a drawing), and a redrawn figure's pixels equal a fresh figure's
    (tests/board/test_tensorboard.py). Used from one thread (the writer's Background)."""

    def __init__(self):
        self.figures: dict = {}  # (layer, head) -> (figure, its images, its suptitle, what fixes its layout)

    def image(
        self, layer, map_NTS: np.ndarray, scale: str, title: str, labels: list[str] | None = None, first_head: int = 0
    ) -> np.ndarray:
        """The heads of `map_NTS` (from `first_head`; `layer` keys the kept figure) as a uint8 RGB image, drawn
        from ≤ MAX_SIDE² block means (said in the title); `labels` name the positions of a map small enough to
        be drawn whole."""
        small_NIJ, f = block_mean(map_NTS)
        if f > 1:
            title, labels = title + f", {f}×{f} block means", None
        layout = (small_NIJ.shape, scale, None if labels is None else tuple(labels))
        kept = self.figures.get(layer)
        if kept is None or kept[-1] != layout:
            fig = render(small_NIJ, scale, title, labels=labels, first_head=first_head)
            rgb = to_rgb(fig)
            fig.set_layout_engine("none")  # keep the positions solved for this first drawing
            # the suptitle is the figure's one text: set_text keeps where the layout put it (suptitle() would not)
            self.figures[layer] = (fig, [ax.images[0] for ax in fig.axes if ax.images], fig.texts[-1], layout)
            return rgb
        fig, images, suptitle, _ = kept
        for image, values_IJ in zip(images, scaled(small_NIJ, scale)[0]):
            image.set_data(values_IJ)
        suptitle.set_text(title)
        return to_rgb(fig)


class Background:
    """One worker thread per writer: images and histograms are built off the training loop's thread.

    `submit(fn, *args)` queues work in order; `wait()` blocks until all of it is done and re-raises the
    first failure. XLA runs without the GIL, so the loop's steps overlap the drawing.
    """

    def __init__(self):

        self.pool, self.pending = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tb"), []

    def submit(self, fn, *args):
        self.pending = [f for f in self.pending if not f.done() or f.exception() is not None]
        self.pending.append(self.pool.submit(fn, *args))

    def wait(self) -> None:
        pending, self.pending = self.pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.pool.shutdown(wait=True)
