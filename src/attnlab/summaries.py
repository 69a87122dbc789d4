"""TensorBoard event writing with tensorboardX (no TensorFlow); tags grouped by what they measure.

Scalar tags: train/, val/, test/, baseline_val/, baseline_test/, opt/, perf/, grad_norm/ (global,
layer_i, group/*, beta where the model has a β), score_grad/layer_i[/head_h] (the gradient at each
layer's attention scores; the layer tag is the norm over heads), attn_<stat>/layer_i (mean over
heads; sorts before its per-head cards) and attn_<stat>/layer_i/head_h. Images: attn_map/layer_i.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from tensorboardX import SummaryWriter
from tensorboardX.proto.summary_pb2 import Summary as XSummary

from attnlab import tb_hparams, tb_images
from attnlab.normalizers import CORE_STATS

# Per layer in the custom-scalars layout: (chart title, tag pattern), every run overlaid.
LAYER_CHARTS = (("entropy (mean over heads)", "attn_entropy/layer_{i}$"),
                ("max weight (mean over heads)", "attn_max_weight/layer_{i}$"),
                ("gradient at the scores (norm over heads)", "score_grad/layer_{i}$"),
                ("gradient norm of the layer", "grad_norm/layer_{i}$"))


def flatten_train_metrics(m: Mapping[str, Any], prefix: str = "train", has_beta: bool = True) -> dict[str, float]:
    """Host metrics of a train step → {tag: float}, per layer and head where they are per layer and head.

    `has_beta=False` (a model without a β, e.g. linear attention) leaves out grad_norm/beta, always 0.
    """
    out = {f"{prefix}/loss": float(m["loss"]), "grad_norm/global": float(m["grad_norm/global"]),
           f"{prefix}/nonfinite_steps": float(m["nonfinite"])}
    for name, v in m.get("grad_norm", {}).items():
        if name == "layer":
            out.update({f"grad_norm/layer_{i}": float(x) for i, x in enumerate(np.asarray(v))})
        elif name != "global" and (has_beta or name != "beta"):
            out[f"grad_norm/{name}"] = float(v)
    if "score_grad" in m:
        for i, row in enumerate(np.asarray(m["score_grad"])):
            out[f"score_grad/layer_{i}"] = float(np.sqrt(np.sum(row**2)))
            out.update({f"score_grad/layer_{i}/head_{h}": float(x) for h, x in enumerate(row)})
    for stat, v in m.get("attn", {}).items():
        for i, row in enumerate(np.asarray(v)):
            if stat not in CORE_STATS and np.isnan(row).all():
                continue  # a hybrid's layer whose normalizer does not report this statistic (model.stack_layer_stats)
            out[f"attn_{stat}/layer_{i}"] = float(np.mean(row))
            out.update({f"attn_{stat}/layer_{i}/head_{h}": float(x) for h, x in enumerate(row)})
    return out


def eval_scalars(split: str, metrics: Mapping[str, float], loss_is_nll: bool) -> dict[str, float]:
    """`split/metric` tags; `nll` is left out where it is the loss itself (softmax_ce, hlgauss)."""
    return {f"{split}/{k}": float(v) for k, v in metrics.items() if not (loss_is_nll and k == "nll")}


def custom_scalars_layout(num_layers: int) -> dict:
    """tensorboardX layout: one category per layer with its four charts, then the global gradient norm."""
    layout = {f"layer {i}": {title: ["Multiline", [pattern.format(i=i)]] for title, pattern in LAYER_CHARTS}
              for i in range(num_layers)}
    layout["global"] = {"gradient norm (global)": ["Multiline", ["grad_norm/global$"]],
                        "train loss": ["Multiline", ["train/loss$"]], "val loss": ["Multiline", ["val/loss$"]]}
    return layout


class Summaries:
    """One run's TensorBoard writer; events land directly in the run directory."""

    def __init__(self, logdir: str, purge_step: int | None = None, attn_map_scale: str = "row"):
        # purge_step drops events at or after it when a resumed run rewrites those steps.
        self.writer = SummaryWriter(logdir=logdir, purge_step=purge_step, flush_secs=30)
        self.attn_map_scale = tb_images.check_scale(attn_map_scale)
        self.background = tb_images.Background()  # images and histograms are drawn off the loop's thread

    def scalars(self, step: int, values: Mapping[str, float]):
        for tag, v in values.items():
            self.writer.add_scalar(tag, v, step)

    def histogram(self, tag: str, values, step: int):
        values = np.asarray(values, np.float64).ravel()
        self.background.submit(self.writer.add_histogram, tag, values, step)

    def layout(self, num_layers: int):
        self.writer.add_custom_scalars(custom_scalars_layout(num_layers))

    def probe_text(self, task, tokens_T, step: int = 0):
        """The probe example as text (`probe/text`), for a task that can decode tokens (the lm task)."""
        if hasattr(task, "decode"):
            self.writer.add_text("probe/text", str(task.decode(tokens_T)), step)

    def attention_images(self, maps_LBNTS, step: int):
        """One RGB image per layer of the fixed probe example (the first validation example), drawn in the
        background from ≤ 256×256 block means per head (tb_images.layer_image)."""
        maps_LBNTS = np.asarray(maps_LBNTS, np.float32)

        def draw():
            for i, layer in enumerate(maps_LBNTS):
                image = tb_images.layer_image(layer[0], self.attn_map_scale,
                                              f"layer {i}, step {step}, {self.attn_map_scale} scale")
                self.writer.add_image(f"attn_map/layer_{i}", image, step, dataformats="HWC")

        self.background.submit(draw)

    def hparams(self, own: Mapping[str, Any], declared: Mapping[str, tuple[list, bool]], metrics: list[str],
                status: str):
        """The sweep's experiment config, then this run's session start and end, in its own directory."""
        own = {k: v for k, v in own.items() if v is not None}
        for pb in (tb_hparams.experiment_summary(declared, metrics), tb_hparams.session_start_summary(own, declared),
                   tb_hparams.session_end_summary(status)):
            # tensorboard's proto and tensorboardX's are the same message in two Python classes.
            self.writer.file_writer.add_summary(XSummary.FromString(pb.SerializeToString()))

    def wait(self):
        """Block until the queued images and histograms are written."""
        self.background.wait()

    def close(self):
        self.background.close()
        self.writer.flush()
        self.writer.close()
