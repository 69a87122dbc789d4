"""Output heads: each owns its output activation, its loss and its metrics, so the two never mismatch.

Choices live in configs/head/<name>.yaml; build one with `make`, check it against a task with
`kind_of` / `compatible` / `check_compatible` before building anything.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab import calibration as cal
from attnlab import checks
from attnlab.groups import declare
from attnlab import registry

KINDS = ("classification", "regression")


def _float(x):
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
    - `metrics(outputs_XK, targets_X, weights_X, baseline_mse=None) -> dict[str, scalar]`: on a
      whole split at once, jax.numpy only, so it can run under jit. Classification heads report
      accuracy, nll, ece, brier; regression heads mse, r2 and (with baseline_mse) mse_rel.
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

    def metrics(self, outputs_XK, targets_X, weights_X, baseline_mse=None) -> dict:
        raise NotImplementedError


class _Classification(Head):
    """Shared parts of classification heads: one Linear to C scores, argmax, calibration metrics."""

    kind = "classification"

    def __init__(self, *, d_model: int, num_classes: int | None, rngs: nnx.Rngs, ece_bins: int = 15):
        if num_classes is None or num_classes < 2:
            raise ValueError(f"{type(self).__name__} needs num_classes >= 2, got {num_classes}")
        self.num_classes = int(num_classes)
        self.ece_bins = checks.integer("head.ece_bins", ece_bins, 1, 10**6)
        self.proj = nnx.Linear(d_model, self.num_classes, rngs=rngs)
        declare("head", self.proj)

    def logits(self, outputs_XC):
        return outputs_XC

    def predict(self, outputs_XC):
        return jnp.argmax(outputs_XC, axis=-1)

    def metrics(self, outputs_XC, targets_X, weights_X, baseline_mse=None) -> dict:
        logits_XC, weights_X = _float(self.logits(outputs_XC)), _float(weights_X)
        targets_X = self._targets(targets_X, weights_X)
        probs_XC = jax.nn.softmax(logits_XC, axis=-1)
        return {
            "accuracy": cal.accuracy(logits_XC, targets_X, weights_X),
            "nll": cal.nll(logits_XC, targets_X, weights_X),
            "ece": cal.ece(probs_XC, targets_X, weights_X, self.ece_bins),
            "brier": cal.brier(probs_XC, targets_X, weights_X),
        }


class SoftmaxCE(_Classification):
    """With a final softmax: probabilities trained with cross-entropy."""

    loss_is_nll = True

    def loss(self, outputs_XC, targets_X, weights_X):
        weights_X = _float(weights_X)
        return cal.nll(_float(outputs_XC), self._targets(targets_X, weights_X), weights_X)


class ScoresMSE(_Classification):
    """Without a final softmax: raw scores, square loss to one-hot; nll/ece/brier use softmax(scores)."""

    def __init__(self, *, d_model: int, num_classes: int | None, rngs: nnx.Rngs,
                 k: float = 1.0, M: float = 1.0, ece_bins: int = 15):
        super().__init__(d_model=d_model, num_classes=num_classes, rngs=rngs, ece_bins=ece_bins)
        self.k = checks.real("head.k", k, 0.0, 1e6, lo_open=True)  # a weight on the true class: > 0
        self.M = checks.real("head.M", M, 0.0, 1e6, lo_open=True)  # the target score of the true class

    def loss(self, outputs_XC, targets_X, weights_X):
        scores_XC, weights_X = _float(outputs_XC), _float(weights_X)
        onehot_XC = cal.one_hot(self._targets(targets_X, weights_X), self.num_classes, scores_XC.dtype)
        # Hui & Belkin 2021, Sec. 3: l = (1/C)[k·(f_c − M)² + Σ_{i≠c} f_i²]; k = M = 1 is plain MSE.
        scale_XC = 1.0 + (self.k - 1.0) * onehot_XC
        per_position_X = (scale_XC * (scores_XC - self.M * onehot_XC) ** 2).mean(-1)
        return cal.weighted_mean(per_position_X, weights_X)


class _Regression(Head):
    """Shared parts of regression heads: mse, r2 and mse_rel of predict(outputs)."""

    kind = "regression"

    @staticmethod
    def _check_num_classes(num_classes):
        if num_classes is not None:
            raise ValueError(f"regression heads take num_classes=None, got {num_classes}")

    def metrics(self, outputs_XK, targets_X, weights_X, baseline_mse=None) -> dict:
        weights_X = _float(weights_X)
        targets_X = _float(self._targets(targets_X, weights_X))
        pred_X = self.predict(outputs_XK)
        mse = cal.weighted_mean((pred_X - targets_X) ** 2, weights_X)
        # r2 = 1 − SSE/SST, SST around the weighted mean of the targets; NaN when targets are constant.
        total = weights_X.sum()
        mean = (weights_X * targets_X).sum() / jnp.where(total > 0, total, 1)
        sse = (weights_X * (targets_X - pred_X) ** 2).sum()
        sst = (weights_X * (targets_X - mean) ** 2).sum()
        out = {"mse": mse, "r2": jnp.where(sst > 0, 1 - sse / jnp.where(sst > 0, sst, 1), jnp.nan)}
        if baseline_mse is not None:
            out["mse_rel"] = mse / baseline_mse
        return out


class MSE(_Regression):
    """Without a final softmax: one scalar output trained with mean squared error."""

    def __init__(self, *, d_model: int, num_classes: int | None = None, rngs: nnx.Rngs):
        self._check_num_classes(num_classes)
        self.proj = nnx.Linear(d_model, 1, rngs=rngs)
        declare("head", self.proj)

    def __call__(self, features_XD):
        return self.proj(features_XD)[..., 0]

    def predict(self, outputs_X):
        return _float(outputs_X)

    def loss(self, outputs_X, targets_X, weights_X):
        weights_X = _float(weights_X)
        targets_X = _float(self._targets(targets_X, weights_X))
        return cal.weighted_mean((_float(outputs_X) - targets_X) ** 2, weights_X)


def hl_gauss_target(y_X, edges_E, sigma):
    """HL-Gauss histogram of N(y, σ²) over bins with edges E (K = E−1 bins), renormalised to the range.

    Imani & White 2018; Farebrother et al. 2024 ("Stop Regressing", Appendix A):
    pᵢ = [erf((e_{i+1}−y)/(√2σ)) − erf((eᵢ−y)/(√2σ))] / [erf((e_K−y)/(√2σ)) − erf((e₀−y)/(√2σ))].
    """
    cdf_XE = jax.scipy.special.erf((edges_E - jnp.asarray(y_X)[..., None]) / (jnp.sqrt(2.0) * sigma))
    return (cdf_XE[..., 1:] - cdf_XE[..., :-1]) / (cdf_XE[..., -1:] - cdf_XE[..., :1])


class HLGauss(_Regression):
    """With a final softmax: a histogram over bins trained with cross-entropy on the HL-Gauss target.

    Keep targets at least 3σ inside [v_min, v_max]: nearer the ends the target is truncated and the
    decoded mean is biased inwards. Targets outside the range are clipped to it.
    """

    loss_is_nll = True

    def __init__(self, *, d_model: int, num_classes: int | None = None, rngs: nnx.Rngs,
                 v_min: float = -10.0, v_max: float = 10.0, num_bins: int = 64,
                 sigma_ratio: float = 0.75):
        self._check_num_classes(num_classes)
        checks.real("head.v_min", v_min, -1e30, 1e30)
        if not v_min < checks.real("head.v_max", v_max, -1e30, 1e30):
            raise ValueError(f"head.v_max={v_max} is invalid; allowed: a number > head.v_min={v_min}")
        checks.integer("head.num_bins", num_bins, 2, 10**6)
        checks.real("head.sigma_ratio", sigma_ratio, 0.0, 1e6, lo_open=True)
        self.v_min, self.v_max, self.num_bins = float(v_min), float(v_max), int(num_bins)
        self.sigma = float(sigma_ratio) * (self.v_max - self.v_min) / self.num_bins  # σ = ratio × bin width
        self.proj = nnx.Linear(d_model, self.num_bins, rngs=rngs)
        declare("head", self.proj)

    def pad_target(self) -> float:
        return (self.v_min + self.v_max) / 2

    def edges(self):
        return jnp.linspace(self.v_min, self.v_max, self.num_bins + 1)

    def centres(self):
        # Plain midpoints of the edges; a published wheel shifted these by a sign error.
        edges_E = self.edges()
        return (edges_E[:-1] + edges_E[1:]) / 2

    def target(self, targets_X):
        """The HL-Gauss target distribution of real targets (clipped into the range)."""
        y_X = jnp.clip(_float(targets_X), self.v_min, self.v_max)
        return hl_gauss_target(y_X, self.edges(), self.sigma)

    def predict(self, outputs_XK):
        return jax.nn.softmax(_float(outputs_XK), axis=-1) @ self.centres()

    def loss(self, outputs_XK, targets_X, weights_X):
        weights_X = _float(weights_X)
        target_XK = self.target(self._targets(targets_X, weights_X))
        ce_X = -(target_XK * jax.nn.log_softmax(_float(outputs_XK), axis=-1)).sum(-1)
        return cal.weighted_mean(ce_X, weights_X)

    def metrics(self, outputs_XK, targets_X, weights_X, baseline_mse=None) -> dict:
        out = super().metrics(outputs_XK, targets_X, weights_X, baseline_mse)
        out["nll"] = self.loss(outputs_XK, targets_X, weights_X)
        return out


def make(name: str, *, d_model: int, num_classes: int | None = None, rngs: nnx.Rngs, **options) -> Head:
    """Build head `name` from configs/head/<name>.yaml, its defaults updated with `options`."""
    cls, opts = registry.options("head", name, **options)
    return cls(d_model=d_model, num_classes=num_classes, rngs=rngs, **opts)


def kind_of(name: str) -> str:
    """The task kind head `name` serves, without building it."""
    return registry.resolve_target(registry.load("head", name).get("_target_")).kind


def compatible(kind: str) -> list[str]:
    """Names of the heads serving task kind `kind`."""
    if kind not in KINDS:
        raise ValueError(f"unknown task kind {kind!r}; kinds: {', '.join(KINDS)}")
    return [name for name in registry.choices("head") if kind_of(name) == kind]


def check_compatible(name: str, task_kind: str, task_name: str = "task") -> None:
    """Raise ValueError at configuration time when head `name` cannot serve the task."""
    head_kind = kind_of(name)
    if head_kind != task_kind:
        raise ValueError(
            f"head {name!r} serves {head_kind}, task {task_name!r} is {task_kind}; "
            f"heads for {task_kind}: {', '.join(compatible(task_kind))}"
        )
