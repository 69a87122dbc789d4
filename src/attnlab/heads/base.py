"""The head contract: a task's output layer that owns its activation, loss and metrics."""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp
from flax import nnx

KINDS = ("classification", "regression")


def upcast(x):
    """At least float32 (bf16 outputs are upcast before a softmax or a square); float64 kept."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


class Head(nnx.Module):
    """A task's output layer, with the loss and metrics that belong to it.

    Contract (shapes: X = any leading dims, e.g. (B, T) for token-level or (B,) for sequence-level
    tasks; K = the head's output width):

    - `kind`: "classification" or "regression", the task kind this head serves.
    - `__init__(*, d_model, num_classes, rngs, **options)`: `num_classes` is required by
      classification heads and must be None for regression heads; options come from the YAML.
    - `__call__(features_XD) -> outputs_XK`: raw outputs of one Linear layer; no activation here,
      the head's activation (softmax or none) is applied inside loss/predict/metrics.
    - `loss(outputs_XK, targets_X, weights_X) -> scalar`: weighted mean sum(w·l) / max(sum(w), 1).
      Positions of weight 0 do not count and their targets are never read (padding may hold
      anything, NaN or out-of-range labels included).
    - `predict(outputs_XK) -> predictions_X`: class index (argmax) or real value.
    - `metric_sums(outputs_XK, targets_X, weights_X) -> dict[str, array]`: sums over positions that
      add up across disjoint sets of positions (eval batches), jax.numpy only, so an evaluation
      accumulates them batch by batch on the device; `metrics_from_sums(sums, baseline_mse=None)`
      turns the sums of a whole split into its metrics, and `metrics(outputs_XK, targets_X,
      weights_X, baseline_mse=None) -> dict[str, scalar]` is the two in a row. Classification heads
      report accuracy, nll, ece, brier; regression heads mse, r2 and (with baseline_mse) mse_rel.
    - Classification heads also have `logits(outputs_XK)`: the logits whose softmax is the
      reported probability, used by calibration metrics and temperature scaling.
    """

    kind: ClassVar[str]
    loss_is_nll: ClassVar[bool] = False  # True: metrics' `nll` is the loss itself (TensorBoard logs it once)

    def __init__(self, *, d_model: int, num_classes: int | None, rngs: nnx.Rngs, **options):
        raise NotImplementedError

    def __call__(self, features_XD):
        return self.proj(features_XD)

    def pad_target(self) -> float:
        """The value swapped in for targets at weight-0 positions (any valid target will do)."""
        return 0

    def _targets(self, targets_X, weights_X):
        """Targets with weight-0 positions replaced, so padding cannot leak NaN into loss or grads."""
        return jnp.where(jnp.asarray(weights_X) > 0, jnp.asarray(targets_X), self.pad_target())

    def loss(self, outputs_XK, targets_X, weights_X):
        raise NotImplementedError

    def predict(self, outputs_XK):
        raise NotImplementedError

    def metric_sums(self, outputs_XK, targets_X, weights_X) -> dict:
        raise NotImplementedError

    def metrics_from_sums(self, sums: dict, baseline_mse=None) -> dict:
        raise NotImplementedError

    def metrics(self, outputs_XK, targets_X, weights_X, baseline_mse=None) -> dict:
        return self.metrics_from_sums(self.metric_sums(outputs_XK, targets_X, weights_X), baseline_mse)


def total(weighted_mean, weights_X):
    """Σ w·v from the weighted mean Σ w·v / max(Σ w, 1) (calibration.weighted_mean) of the same weights."""
    return weighted_mean * jnp.maximum(weights_X.sum(), 1)
