"""Regression heads: a real prediction per position, by a scalar (MSE) or a histogram (HL-Gauss)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.heads import calibration as cal
from attnlab.model.groups import tag
from attnlab.options import heads as head_options

from .base import Head, total, upcast


class _Regression(Head):
    """Shared parts of regression heads: mse, r2 and mse_rel of predict(outputs)."""

    kind = "regression"

    @staticmethod
    def _check_num_classes(num_classes):
        if num_classes is not None:
            raise ValueError(f"regression heads take num_classes=None, got {num_classes}")

    def metric_sums(self, outputs_XK, targets_X, weights_X) -> dict:
        weights_X = upcast(weights_X)
        targets_X = upcast(self._targets(targets_X, weights_X))
        pred_X = self.predict(outputs_XK)
        return {
            "weight": weights_X.sum(),
            "sse": (weights_X * (pred_X - targets_X) ** 2).sum(),
            "y": (weights_X * targets_X).sum(),
            "yy": (weights_X * targets_X**2).sum(),
        }

    def metrics_from_sums(self, sums: dict, baseline_mse=None) -> dict:
        w = sums["weight"]
        mse = sums["sse"] / jnp.maximum(w, 1)
        # r2 = 1 − SSE/SST, SST = Σw(y − ȳ)² = Σwy² − ȳ·Σwy around the weighted mean ȳ; NaN when
        # targets are constant (SST ≤ 0 after rounding).
        mean = sums["y"] / jnp.where(w > 0, w, 1)
        sst = sums["yy"] - mean * sums["y"]
        out = {"mse": mse, "r2": jnp.where(sst > 0, 1 - sums["sse"] / jnp.where(sst > 0, sst, 1), jnp.nan)}
        if baseline_mse is not None:
            out["mse_rel"] = mse / baseline_mse
        return out


class MSE(_Regression):
    """Without a final softmax: one scalar output trained with mean squared error."""

    def __init__(self, *, d_model: int, num_classes: int | None = None, rngs: nnx.Rngs):
        self._check_num_classes(num_classes)
        self.proj = nnx.Linear(d_model, 1, rngs=rngs)
        tag("head", self.proj)

    def __call__(self, features_XD):
        return self.proj(features_XD)[..., 0]

    def predict(self, outputs_X):
        return upcast(outputs_X)

    def loss(self, outputs_X, targets_X, weights_X):
        weights_X = upcast(weights_X)
        targets_X = upcast(self._targets(targets_X, weights_X))
        return cal.weighted_mean((upcast(outputs_X) - targets_X) ** 2, weights_X)


def hl_gauss_target(y_X, edges_E, sigma):
    """HL-Gauss histogram of N(y, σ²) over bins with edges E (K = E−1 bins), renormalised to the range.

    Imani & White 2018; Farebrother et al. 2024 ("Stop Regressing", Appendix A):
    pᵢ = [erf((e_{i+1}−y)/(√2σ)) − erf((eᵢ−y)/(√2σ))] / [erf((e_K−y)/(√2σ)) − erf((e₀−y)/(√2σ))].
    """
    y_X = jnp.asarray(y_X)
    edges_XE = jnp.expand_dims(edges_E, tuple(range(y_X.ndim)))
    cdf_XE = jax.scipy.special.erf((edges_XE - y_X[..., None]) / (jnp.sqrt(2.0) * sigma))
    return (cdf_XE[..., 1:] - cdf_XE[..., :-1]) / (cdf_XE[..., -1:] - cdf_XE[..., :1])


class HLGauss(_Regression):
    """With a final softmax: a histogram over bins trained with cross-entropy on the HL-Gauss target.

    Keep targets at least 3σ inside [v_min, v_max]: nearer the ends the target is truncated and the
    decoded mean is biased inwards. Targets outside the range are clipped to it.
    """

    loss_is_nll = True

    def __init__(
        self,
        *,
        d_model: int,
        num_classes: int | None = None,
        rngs: nnx.Rngs,
        v_min: float = -10.0,
        v_max: float = 10.0,
        num_bins: int = 64,
        sigma_ratio: float = 0.75,
    ):
        self._check_num_classes(num_classes)
        head_options.hlgauss(v_min=v_min, v_max=v_max, num_bins=num_bins, sigma_ratio=sigma_ratio)
        self.v_min, self.v_max, self.num_bins = float(v_min), float(v_max), int(num_bins)
        self.sigma = float(sigma_ratio) * (self.v_max - self.v_min) / self.num_bins  # σ = ratio × bin width
        self.proj = nnx.Linear(d_model, self.num_bins, rngs=rngs)
        tag("head", self.proj)

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
        y_X = jnp.clip(upcast(targets_X), self.v_min, self.v_max)
        return hl_gauss_target(y_X, self.edges(), self.sigma)

    def predict(self, outputs_XK):
        return jax.nn.softmax(upcast(outputs_XK), axis=-1) @ self.centres()

    def loss(self, outputs_XK, targets_X, weights_X):
        weights_X = upcast(weights_X)
        target_XK = self.target(self._targets(targets_X, weights_X))
        ce_X = -(target_XK * jax.nn.log_softmax(upcast(outputs_XK), axis=-1)).sum(-1)
        return cal.weighted_mean(ce_X, weights_X)

    def metric_sums(self, outputs_XK, targets_X, weights_X) -> dict:
        sums = super().metric_sums(outputs_XK, targets_X, weights_X)
        return {**sums, "nll": total(self.loss(outputs_XK, targets_X, weights_X), upcast(weights_X))}

    def metrics_from_sums(self, sums: dict, baseline_mse=None) -> dict:
        return {**super().metrics_from_sums(sums, baseline_mse), "nll": sums["nll"] / jnp.maximum(sums["weight"], 1)}
