"""TensorBoard event writing with tensorboardX (no TensorFlow); tags grouped by what they measure."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from tensorboardX import SummaryWriter
from tensorboardX.summary import hparams as hparams_summary

from attnlab.normalizers import CORE_STATS


def flatten_train_metrics(m: Mapping[str, Any], prefix: str = "train") -> dict[str, float]:
    """Host metrics of a train step → {tag: float}, per layer and head where they are per layer and head.

    Tag groups: train/, grad_norm/ (global, layer_i, group/*, beta), score_grad/layer_i[/head_h]
    (the gradient at each layer's attention scores), attn_<stat>/layer_i/head_h.
    """
    out = {f"{prefix}/loss": float(m["loss"]), "grad_norm/global": float(m["grad_norm/global"]),
           f"{prefix}/nonfinite_steps": float(m["nonfinite"])}
    for name, v in m.get("grad_norm", {}).items():
        if name == "layer":
            out.update({f"grad_norm/layer_{i}": float(x) for i, x in enumerate(np.asarray(v))})
        elif name != "global":
            out[f"grad_norm/{name}"] = float(v)
    if "score_grad" in m:
        for i, row in enumerate(np.asarray(m["score_grad"])):
            out[f"score_grad/layer_{i}"] = float(np.sqrt(np.sum(row**2)))
            out.update({f"score_grad/layer_{i}/head_{h}": float(x) for h, x in enumerate(row)})
    for stat, v in m.get("attn", {}).items():
        for i, row in enumerate(np.asarray(v)):
            if stat not in CORE_STATS and np.isnan(row).all():
                continue  # a hybrid's layer whose normalizer does not report this statistic (model.stack_layer_stats)
            out.update({f"attn_{stat}/layer_{i}/head_{h}": float(x) for h, x in enumerate(row)})
    return out


class Summaries:
    """One run's TensorBoard writer; events land directly in the run directory."""

    def __init__(self, logdir: str, purge_step: int | None = None):
        # purge_step drops events at or after it when a resumed run rewrites those steps.
        self.writer = SummaryWriter(logdir=logdir, purge_step=purge_step, flush_secs=30)

    def scalars(self, step: int, values: Mapping[str, float]):
        for tag, v in values.items():
            self.writer.add_scalar(tag, v, step)

    def histogram(self, tag: str, values, step: int):
        self.writer.add_histogram(tag, np.asarray(values, np.float64).ravel(), step)

    def attention_images(self, maps_LBNTS, step: int):
        """One image per layer: the probe example's heads side by side, rows = queries."""
        for i, layer in enumerate(np.asarray(maps_LBNTS, np.float32)):
            heads = layer[0]  # (N, T, S) of the probe example
            img = np.concatenate([h / max(h.max(), 1e-9) for h in heads], axis=1)
            self.writer.add_image(f"attn_map/layer_{i}", img[None], step, dataformats="CHW")

    def hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float]):
        """HParams written into this run's own directory (tensorboardX add_hparams would make a sub-run)."""
        clean = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in hparams.items()}
        for summary in hparams_summary(clean, dict(metrics)):
            self.writer.file_writer.add_summary(summary)

    def close(self):
        self.writer.flush()
        self.writer.close()
