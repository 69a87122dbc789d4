"""Calibration metrics (NLL, Brier, ECE) and post-hoc temperature scaling.

Each metric is written once and runs on either array library: numpy arrays are computed with numpy,
jax arrays and tracers with jax.numpy (inside the jit-ed head metrics). Temperature scaling runs on the
device (jax only) on a bounded sample of a split's positions.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

ECE_BINS = 15  # equal-width confidence bins of Guo et al. 2017 (gpleiss/temperature_scaling)
# The temperature is fitted on at most this many target positions of the val split (token-level tasks:
# 16 windows of 1024 bytes; one parameter, so its standard error stays small); the number used is
# recorded beside the metrics (val/positions_ts). Each Newton step is a softmax over positions × classes.
CALIBRATION_POSITIONS = 16_384


def _xp(*arrays):
    """numpy when every input is a numpy array, jax.numpy otherwise (jax arrays, tracers)."""
    return np if all(isinstance(a, (np.ndarray, np.generic)) for a in arrays) else jnp


def weighted_mean(values_X, weights_X):
    """sum(w·v) / max(sum(w), 1): weights are masks or counts, so an all-zero split gives 0, not NaN."""
    return (weights_X * values_X).sum() / _xp(values_X, weights_X).maximum(weights_X.sum(), 1)


def log_softmax(logits_XC):
    """Log-probabilities over the last axis."""
    if _xp(logits_XC) is np:
        return scipy.special.log_softmax(logits_XC, axis=-1)
    return jax.nn.log_softmax(logits_XC, axis=-1)


def softmax(logits_XC):
    """Probabilities over the last axis."""
    return _xp(logits_XC).exp(log_softmax(logits_XC))


def one_hot(labels_X, num_classes: int, dtype):
    """One-hot rows; a label outside [0, C) gives a zero row (harmless where its weight is 0)."""
    xp = _xp(labels_X)
    classes_1C = xp.expand_dims(xp.arange(num_classes), tuple(range(labels_X.ndim)))
    return (labels_X[..., None] == classes_1C).astype(dtype)


def nll(logits_XC, labels_X, weights_X):
    """Weighted mean cross-entropy of softmax(logits) against integer labels."""
    logp_XC = log_softmax(logits_XC)
    onehot_XC = one_hot(labels_X, logp_XC.shape[-1], logp_XC.dtype)
    return weighted_mean(-(onehot_XC * logp_XC).sum(-1), weights_X)


def accuracy(scores_XC, labels_X, weights_X):
    """Weighted fraction of positions whose argmax is the label."""
    return weighted_mean((scores_XC.argmax(-1) == labels_X).astype(scores_XC.dtype), weights_X)


def brier(probs_XC, labels_X, weights_X):
    """Multi-class Brier score: sum over classes of (p − onehot)², weighted mean over positions."""
    onehot_XC = one_hot(labels_X, probs_XC.shape[-1], probs_XC.dtype)
    return weighted_mean(((probs_XC - onehot_XC) ** 2).sum(-1), weights_X)


def ece_gaps(probs_XC, labels_X, weights_X, n_bins: int = ECE_BINS):
    """Per confidence bin b: Σ_{i∈b} w_i (correct_i − conf_i), additive over disjoint sets of positions."""
    xp = _xp(probs_XC, labels_X, weights_X)
    conf_X = probs_XC.max(-1)
    correct_X = (probs_XC.argmax(-1) == labels_X).astype(conf_X.dtype)
    # Bin b holds b/n < conf <= (b+1)/n, as in gpleiss/temperature_scaling's _ECELoss.
    bin_X = xp.clip(xp.ceil(conf_X * n_bins).astype(np.int32) - 1, 0, n_bins - 1)
    in_bin_XB = one_hot(bin_X, n_bins, conf_X.dtype)
    return (in_bin_XB * (weights_X * (correct_X - conf_X))[..., None]).reshape(-1, n_bins).sum(0)


def ece(probs_XC, labels_X, weights_X, n_bins: int = ECE_BINS):
    """Expected calibration error over equal-width confidence bins (Guo et al. 2017), weighted."""
    # Σ_b (W_b/W)·|acc_b − conf_b| = Σ_b |Σ_{i∈b} w_i (correct_i − conf_i)| / W
    gap_B = ece_gaps(probs_XC, labels_X, weights_X, n_bins)
    return _xp(gap_B).abs(gap_B).sum() / _xp(weights_X).maximum(weights_X.sum(), 1)


def calibration_sample(logits_XC, labels_X, weights_X, max_positions: int = CALIBRATION_POSITIONS):
    """(logits_NC, labels_N, weights_N, count): the first `max_positions` positions of weight > 0, on device.

    N = min(max_positions, positions) is static, so this runs under jit; rows past `count` have weight 0.
    Only positions that carry a target are kept (MQAR: 4 of 64), in split order, so every run of a split
    uses the same ones.
    """
    z_PC = logits_XC.reshape(-1, logits_XC.shape[-1])
    y_P, w_P = labels_X.reshape(-1), weights_X.reshape(-1)
    n = min(max_positions, w_P.shape[0])
    idx_N = jnp.nonzero(w_P > 0, size=n, fill_value=0)[0]
    count = jnp.minimum(jnp.count_nonzero(w_P > 0), n)
    w_N = jnp.where(jnp.arange(n) < count, w_P[idx_N], 0)
    return z_PC[idx_N], y_P[idx_N], w_N, count


def _nll_slope_curvature(b, z_NC, y_N, w_N):
    """Weighted NLL of softmax(b·z) and its first two derivatives in the inverse temperature b.

    d/db = Σ w (E_p[z] − z_y) / W and d²/db² = Σ w Var_p[z] / W ≥ 0: the NLL is convex in b.
    """
    logp_NC = jax.nn.log_softmax(b * z_NC, axis=-1)
    p_NC = jnp.exp(logp_NC)
    mean_N = (p_NC * z_NC).sum(-1)
    var_N = (p_NC * jnp.square(z_NC - mean_N[:, None])).sum(-1)
    z_y_N = jnp.take_along_axis(z_NC, y_N[:, None], axis=-1)[:, 0]
    logp_y_N = jnp.take_along_axis(logp_NC, y_N[:, None], axis=-1)[:, 0]
    return (weighted_mean(-logp_y_N, w_N), weighted_mean(mean_N - z_y_N, w_N), weighted_mean(var_N, w_N))


def fit_temperature(logits_NC, labels_N, weights_N, max_iter: int = 60):
    """One temperature T minimising weighted validation NLL of softmax(logits / T) (Guo et al. 2017), jitted.

    Pass logits (not probabilities) from the model in eval mode (dropout off), as the pitfalls
    reported on gpleiss/temperature_scaling warn. The NLL is convex in b = 1/T, so a safeguarded Newton
    iteration on b in [1e-2, 1e2] finds the minimum: the slope's sign shrinks the bracket, and a Newton
    step leaving it is replaced by bisection (in log b). T = 1 when the fit would not lower the NLL.
    """
    z_NC = jnp.asarray(logits_NC, jnp.float32)
    y_N = jnp.clip(jnp.asarray(labels_N, jnp.int32), 0, z_NC.shape[-1] - 1)
    w_N = jnp.asarray(weights_N, jnp.float32)
    return _fit_b(z_NC, y_N, w_N, max_iter)


@functools.partial(jax.jit, static_argnames="max_iter")
def _fit_b(z_NC, y_N, w_N, max_iter):
    def body(carry):
        i, lo, hi, b, _ = carry
        _, g, h = _nll_slope_curvature(b, z_NC, y_N, w_N)
        lo, hi = jnp.where(g < 0, b, lo), jnp.where(g > 0, b, hi)  # the minimum lies on the descending side
        newton = b - g / jnp.maximum(h, 1e-30)
        b_new = jnp.where((newton > lo) & (newton < hi), newton, jnp.sqrt(lo * hi))
        return i + 1, lo, hi, b_new, jnp.abs(b_new - b) <= 1e-6 * b

    lo, hi = jnp.float32(1e-2), jnp.float32(1e2)
    carry = (jnp.int32(0), lo, hi, jnp.float32(1.0), jnp.bool_(False))
    _, _, _, b, _ = jax.lax.while_loop(lambda c: (c[0] < max_iter) & ~c[4], body, carry)
    better = _nll_slope_curvature(b, z_NC, y_N, w_N)[0] <= _nll_slope_curvature(1.0, z_NC, y_N, w_N)[0]
    return jnp.where(better, 1.0 / b, 1.0)
