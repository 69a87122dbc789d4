"""Classification heads: C scores per position, argmax predictions, calibration metrics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab import checks
from attnlab.heads import calibration as cal
from attnlab.model.groups import tag
from attnlab.options import heads as head_options

from .base import Head, total, upcast


class _Classification(Head):
    """Shared parts of classification heads: one Linear to C scores, argmax, calibration metrics."""

    kind = "classification"

    def __init__(self, *, d_model: int, num_classes: int | None, rngs: nnx.Rngs, ece_bins: int = 15, bias: bool = True):
        if num_classes is None or num_classes < 2:
            raise checks.ConfigError(f"{type(self).__name__} needs num_classes >= 2, got {num_classes}")
        self.num_classes = int(num_classes)
        head_options.classification(ece_bins=ece_bins, bias=bias)
        self.ece_bins = ece_bins
        self.proj = nnx.Linear(d_model, self.num_classes, use_bias=bias, rngs=rngs)
        tag("head", self.proj)

    def logits(self, outputs_XC):
        return outputs_XC

    def predict(self, outputs_XC):
        return jnp.argmax(outputs_XC, axis=-1)

    def metric_sums(self, outputs_XC, targets_X, weights_X) -> dict:
        logits_XC, weights_X = upcast(self.logits(outputs_XC)), upcast(weights_X)
        targets_X = self._targets(targets_X, weights_X)
        probs_XC = jax.nn.softmax(logits_XC, axis=-1)
        return {
            "weight": weights_X.sum(),
            "accuracy": total(cal.accuracy(logits_XC, targets_X, weights_X), weights_X),
            "nll": total(cal.nll(logits_XC, targets_X, weights_X), weights_X),
            "ece_gap": cal.ece_gaps(probs_XC, targets_X, weights_X, self.ece_bins),
            "brier": total(cal.brier(probs_XC, targets_X, weights_X), weights_X),
        }

    def metrics_from_sums(self, sums: dict, baseline_mse=None) -> dict:
        w = jnp.maximum(sums["weight"], 1)
        return {
            "accuracy": sums["accuracy"] / w,
            "nll": sums["nll"] / w,
            "ece": jnp.abs(sums["ece_gap"]).sum() / w,
            "brier": sums["brier"] / w,
        }


class SoftmaxCE(_Classification):
    """With a final softmax: probabilities trained with cross-entropy."""

    loss_is_nll = True

    def loss(self, outputs_XC, targets_X, weights_X):
        weights_X = upcast(weights_X)
        return cal.nll(upcast(outputs_XC), self._targets(targets_X, weights_X), weights_X)


class ScoresMSE(_Classification):
    """Without a final softmax: raw scores, square loss to one-hot; nll/ece/brier use softmax(scores)."""

    def __init__(
        self,
        *,
        d_model: int,
        num_classes: int | None,
        rngs: nnx.Rngs,
        k: float = 1.0,
        M: float = 1.0,
        ece_bins: int = 15,
        bias: bool = True,
    ):
        super().__init__(d_model=d_model, num_classes=num_classes, rngs=rngs, ece_bins=ece_bins, bias=bias)
        head_options.scores_mse(k=k, M=M)
        self.k, self.M = float(k), float(M)

    def loss(self, outputs_XC, targets_X, weights_X):
        scores_XC, weights_X = upcast(outputs_XC), upcast(weights_X)
        onehot_XC = cal.one_hot(self._targets(targets_X, weights_X), self.num_classes, scores_XC.dtype)
        # Hui & Belkin 2021, Sec. 3: l = (1/C)[k·(f_c − M)² + Σ_{i≠c} f_i²]; k = M = 1 is plain MSE.
        scale_XC = 1.0 + (self.k - 1.0) * onehot_XC
        per_position_X = (scale_XC * (scores_XC - self.M * onehot_XC) ** 2).mean(-1)
        return cal.weighted_mean(per_position_X, weights_X)
