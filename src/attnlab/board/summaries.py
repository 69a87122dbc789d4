"""TensorBoard event writing with tensorboardX (no TensorFlow); tags grouped by what they measure.

Scalar tags: 0_main/ (copies of train/loss, val/loss, the val headline metric, attn_entropy/layer_i and
grad_norm/layer_i, so Time Series opens on them), train/, val/, test/, baseline_val/, baseline_test/, opt/, perf/,
grad_norm/ (global, layer_i, group/*, beta where the model has a β), score_grad/layer_i[/head_h] (the gradient at each
layer's attention scores; the layer tag is the norm over heads), attn_<stat>/layer_i (mean over
heads; sorts before its per-head cards) and attn_<stat>/layer_i/head_h. Images: attn_map/layer_i/head_h.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.scalar.metadata import create_summary_metadata
from tensorboardX import SummaryWriter
from tensorboardX.proto.summary_pb2 import Summary as XSummary

from attnlab.board import images
from attnlab.board.hparams import Column, experiment_summary, session_end_summary, session_start_summary
from attnlab.model.groups import named_grad_norms
from attnlab.statistics import CORE_STATS, SINK_EPSILON, STATISTICS

# Per layer in the custom-scalars layout: (chart title, tag pattern, whether only a model with
# extreme_token_stats logs it), every run overlaid.
LAYER_CHARTS = (
    *((s.chart, f"attn_{s.name}/layer_{{i}}$", s.extreme) for s in STATISTICS if s.chart),
    ("gradient at the scores (norm over heads)", "score_grad/layer_{i}$", False),
    ("gradient norm of the layer", "grad_norm/layer_{i}$", False),
)


# What a tag measures, shown in TensorBoard's tag tooltip (the first event of each tag carries it).
# The attn_* ones are attnlab.statistics.STATISTICS'.
DESCRIPTIONS = {
    **{f"attn_{s.name}/": s.description for s in STATISTICS},
    "attn_sink_rate": f"share of heads whose mean first-key weight exceeds {SINK_EPSILON} (the sink rate, Gu et al. "
    "2024), per layer and over every head",
    "score_grad/": "norm of dL/dz, the gradient at the attention scores z = q·k (norm over heads for layer_i)",
    "grad_norm/": "gradient norm before clipping (global, per layer, per module group)",
    "opt/lr": "learning rate of the update at this step, read from the optimizer state",
    "train/loss": "training loss of this step's batch",
    "test_len/": "a final metric on the test split rebuilt at length T (task.test_lengths), every other task option "
    "unchanged; attn_* as in training, mean over heads",
}


def description(tag: str) -> str:
    return next((d for prefix, d in DESCRIPTIONS.items() if tag.startswith(prefix)), "")


def flatten_train_metrics(m: Mapping[str, Any], prefix: str = "train", has_beta: bool = True) -> dict[str, float]:
    """Host metrics of a train step → {tag: float}, per layer and head where they are per layer and head.

    `has_beta=False` (a model without a β, e.g. linear attention) leaves out grad_norm/beta, always 0.
    """
    out = {f"{prefix}/loss": float(m["loss"]), f"{prefix}/nonfinite_steps": float(m["nonfinite"])}
    for name, v in named_grad_norms(np.asarray(m["grad_norm"])).items():
        if name == "layer":
            out.update({f"grad_norm/layer_{i}": float(x) for i, x in enumerate(v)})
        elif has_beta or name != "beta":
            out[f"grad_norm/{name}"] = float(v)
    if "score_grad" in m:
        for i, row in enumerate(np.asarray(m["score_grad"])):
            if np.isnan(row).all():
                continue  # a layer with no score matrix (steps.probes_per_layer)
            out[f"score_grad/layer_{i}"] = float(np.sqrt(np.sum(row**2)))
            out.update({f"score_grad/layer_{i}/head_{h}": float(x) for h, x in enumerate(row)})
    for stat, v in m.get("attn", {}).items():
        for i, row in enumerate(np.asarray(v)):
            if stat not in CORE_STATS and np.isnan(row).all():
                continue  # a hybrid's layer whose normalizer does not report this statistic (model.stack_layer_stats)
            out[f"attn_{stat}/layer_{i}"] = float(np.mean(row))
            out.update({f"attn_{stat}/layer_{i}/head_{h}": float(x) for h, x in enumerate(row)})
    if "first_weight" in m.get("attn", {}):  # Gu et al. 2024's sink rate of this step's per-head first-key weights
        sink_LN = np.asarray(m["attn"]["first_weight"]) > SINK_EPSILON  # per head: 1 for a sink head
        for i, row in enumerate(sink_LN):
            out[f"attn_sink_rate/layer_{i}"] = float(row.mean())
            out.update({f"attn_sink_rate/layer_{i}/head_{h}": float(x) for h, x in enumerate(row)})
        out["attn_sink_rate"] = float(sink_LN.mean())
    return out


def eval_scalars(split: str, metrics: Mapping[str, float], loss_is_nll: bool) -> dict[str, float]:
    """`split/metric` tags; `nll` is left out where it is the loss itself (softmax_ce, hlgauss)."""
    return {f"{split}/{k}": float(v) for k, v in metrics.items() if not (loss_is_nll and k == "nll")}


# Time Series sorts its groups by name, so copies of the loss and headline curves under this group
# come first (a digit sorts before every statistic's group).
MAIN = "0_main"


def custom_scalars_layout(num_layers: int, headline: str = "accuracy", extreme: bool = False) -> dict:
    """tensorboardX layout: a first category with the losses, the headline metric and, per layer, the two statistics
    the normalizers are compared on (attention entropy and the layer's gradient norm); then one category per layer
    with its charts (the residual stream's with `extreme`, model.extreme_token_stats), then the global gradient
    norm."""
    first = {
        "train loss": ["Multiline", ["train/loss$"]],
        "val loss": ["Multiline", ["val/loss$"]],
        f"val {headline}": ["Multiline", [f"val/{headline}$"]],
    }
    for i in range(num_layers):
        first[f"layer {i}: entropy"] = ["Multiline", [f"attn_entropy/layer_{i}$"]]
        first[f"layer {i}: gradient norm"] = ["Multiline", [f"grad_norm/layer_{i}$"]]
    layout = {"losses, entropy and gradient norms": first}
    layout.update(
        {
            f"layer {i}": {
                title: ["Multiline", [pattern.format(i=i)]]
                for title, pattern, needs_extreme in LAYER_CHARTS
                if extreme or not needs_extreme
            }
            for i in range(num_layers)
        }
    )
    layout["global"] = {"gradient norm (global)": ["Multiline", ["grad_norm/global$"]]}
    return layout


class Summaries:
    """One run's TensorBoard writer; events land directly in the run directory."""

    def __init__(self, logdir: str, purge_step: int | None = None, attn_map_scale: str = "row"):
        # purge_step drops events at or after it when a resumed run rewrites those steps.
        self.writer = SummaryWriter(logdir=logdir, purge_step=purge_step, flush_secs=30)
        self.attn_map_scale = images.check_scale(attn_map_scale)
        self.figures = images.Figures()  # drawn on self.background's one thread
        self.described: set[str] = set()
        self.main: set[str] = set()  # tags copied under MAIN (set by layout)
        self.labels: list[str] | None = None  # the shown example's characters (images.char_labels), set by shown_text
        self.background = images.Background()  # images and histograms are drawn off the loop's thread

    # Nothing non-finite reaches the writer: tensorboardX warns per NaN and refuses an empty histogram;
    # a skipped step is counted in train/nonfinite_steps and a diverged run says so in metrics.json.
    def scalars(self, step: int, values: Mapping[str, float]):
        for tag, v in values.items():
            if not np.isfinite(v):
                continue
            first = tag not in self.described
            self.described.add(tag)
            self._scalar(tag, v, step, description(tag) if first else None)
            if tag in self.main:
                self._scalar(
                    f"{MAIN}/{tag.replace('/', '_')}",
                    v,
                    step,
                    f"a copy of {tag}, first in Time Series" if first else None,
                )

    def _scalar(self, tag: str, value: float, step: int, described: str | None):
        """One scalar; `described` (a tag's first event) adds its description under the scalars plugin's
        metadata. tensorboardX's add_scalar(summary_description=...) writes metadata naming no plugin, which
        TensorBoard's EventAccumulator warns about once per tag and run ("oddly not associated with a plugin")."""
        if described is None:
            self.writer.add_scalar(tag, value, step)
            return
        pb = Summary(
            value=[
                Summary.Value(
                    tag=tag,
                    simple_value=float(value),
                    metadata=create_summary_metadata(display_name="", description=described),
                )
            ]
        )
        self.writer.file_writer.add_summary(XSummary.FromString(pb.SerializeToString()), step)

    def histogram(self, tag: str, values, step: int):
        values = np.asarray(values, np.float64).ravel()
        values = values[np.isfinite(values)]
        if values.size:
            self.background.submit(self.writer.add_histogram, tag, values, step)

    def layout(self, num_layers: int, headline: str = "accuracy", extreme: bool = False):
        """The custom-scalars layout, and which tags get a first-group copy in Time Series."""
        self.writer.add_custom_scalars(custom_scalars_layout(num_layers, headline, extreme))
        # attention entropy and each layer's gradient norm, the statistics the normalizers are compared on, beside
        # the losses: Time Series sorts its groups by name and shows attn_beta/ before attn_entropy/, below the fold
        self.main = {
            "train/loss",
            "val/loss",
            f"val/{headline}",
            *(f"attn_entropy/layer_{i}" for i in range(num_layers)),
            *(f"grad_norm/layer_{i}" for i in range(num_layers)),
        }

    def shown_text(self, task, tokens_T, step: int = 0):
        """The shown example as text (`example/text`), for a text task (Task.is_text)."""
        if task.is_text:
            self.writer.add_text("example/text", str(task.decode(tokens_T)), step)
        self.labels = images.char_labels(task, tokens_T)

    def continuation(self, prompt: str, written: str, step: int):
        """`sample/continuation`: the shown example's prompt and what the model wrote after it (greedy), as a code block
        so TensorBoard's Markdown keeps the text's whitespace."""
        block = "\n".join("    " + line for line in f"{prompt}▶{written}".split("\n"))
        self.writer.add_text(
            "sample/continuation", f"prompt ▶ greedy continuation ({len(written)} chars)\n\n{block}", step
        )

    def attention_images(self, maps_LBNTS, step: int):
        """One RGB image per layer and head of the shown example (the fixed first validation example), drawn in
        the background from ≤ 256×256 block means (images.Figures, one kept per head); a non-finite map is
        skipped."""
        maps_LBNTS = np.asarray(maps_LBNTS, np.float32)
        labels = self.labels

        def draw():  # one card per head: a layer's heads side by side are unreadable at card size
            for i, layer in enumerate(maps_LBNTS):
                if not np.isfinite(layer[0]).all():
                    continue
                for h in range(layer.shape[1]):
                    image = self.figures.image(
                        (i, h),
                        layer[0, h : h + 1],
                        self.attn_map_scale,
                        f"layer {i} head {h}, step {step}, {self.attn_map_scale} scale",
                        labels,
                        first_head=h,
                    )
                    self.writer.add_image(f"attn_map/layer_{i}/head_{h}", image, step, dataformats="HWC")

        self.background.submit(draw)

    def hparams(self, own: Mapping[str, Any], declared: Mapping[str, Column], metrics: list[str], status: str):
        """The sweep's experiment config, then this run's session start and end, in its own directory."""
        own = {k: v for k, v in own.items() if v is not None}
        for pb in (
            experiment_summary(declared, metrics),
            session_start_summary(own, declared),
            session_end_summary(status),
        ):
            # tensorboard's proto and tensorboardX's are the same message in two Python classes.
            self.writer.file_writer.add_summary(XSummary.FromString(pb.SerializeToString()))

    def wait(self):
        """Block until the queued images and histograms are written."""
        self.background.wait()

    def close(self):
        self.background.close()
        self.writer.flush()
        self.writer.close()
