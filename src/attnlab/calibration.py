"""Calibration metrics (NLL, Brier, ECE) and post-hoc temperature scaling.

Each metric is written once and runs on either array library: numpy arrays are computed with numpy
(float64 for the temperature fit and its report), jax arrays and tracers with jax.numpy (inside the
jit-ed head metrics).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize
import scipy.special

ECE_BINS = 15  # equal-width confidence bins of Guo et al. 2017 (gpleiss/temperature_scaling)


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
    return (labels_X[..., None] == _xp(labels_X).arange(num_classes)).astype(dtype)


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


def ece(probs_XC, labels_X, weights_X, n_bins: int = ECE_BINS):
    """Expected calibration error over equal-width confidence bins (Guo et al. 2017), weighted."""
    xp = _xp(probs_XC, labels_X, weights_X)
    conf_X = probs_XC.max(-1)
    correct_X = (probs_XC.argmax(-1) == labels_X).astype(conf_X.dtype)
    # Bin b holds b/n < conf <= (b+1)/n, as in gpleiss/temperature_scaling's _ECELoss.
    bin_X = xp.clip(xp.ceil(conf_X * n_bins).astype(np.int32) - 1, 0, n_bins - 1)
    in_bin_XB = (bin_X[..., None] == xp.arange(n_bins)).astype(conf_X.dtype)
    # Σ_b (W_b/W)·|acc_b − conf_b| = Σ_b |Σ_{i∈b} w_i (correct_i − conf_i)| / W
    gap_B = (in_bin_XB * (weights_X * (correct_X - conf_X))[..., None]).reshape(-1, n_bins).sum(0)
    return xp.abs(gap_B).sum() / xp.maximum(weights_X.sum(), 1)


def _float64(logits, labels, weights):
    return np.asarray(logits, np.float64), np.asarray(labels), np.asarray(weights, np.float64)


def fit_temperature(logits_NC, labels_N, weights_N) -> float:
    """One temperature T minimising weighted validation NLL of softmax(logits / T) (Guo et al. 2017).

    Pass logits (not probabilities) from the model in eval mode (dropout off), as the pitfalls
    reported on gpleiss/temperature_scaling warn.
    """
    z_NC, y_N, w_N = _float64(logits_NC, labels_N, weights_N)

    def objective(log_t: float) -> float:
        return float(nll(z_NC / np.exp(log_t), y_N, w_N))

    # NLL is convex in 1/T, hence unimodal in log T: bounded Brent in float64 finds the minimum to
    # xatol without the early stop of a few LBFGS steps on T itself.
    res = scipy.optimize.minimize_scalar(
        objective, bounds=(np.log(1e-2), np.log(1e2)), method="bounded",
        options={"xatol": 1e-7, "maxiter": 500},
    )
    if not res.success or res.fun > objective(0.0):  # never worse than leaving the logits alone
        return 1.0
    return float(np.exp(res.x))


def temperature_report(val_logits, val_labels, val_w, test_logits, test_labels, test_w,
                       n_bins: int = ECE_BINS) -> dict[str, float]:
    """Fit T on validation; test-split ECE, NLL and accuracy before and after (the *_ts keys)."""
    t = fit_temperature(val_logits, val_labels, val_w)
    z_NC, y_N, w_N = _float64(test_logits, test_labels, test_w)
    report = {"temperature": t}
    for suffix, logits_NC in (("", z_NC), ("_ts", z_NC / t)):
        report["ece" + suffix] = float(ece(softmax(logits_NC), y_N, w_N, n_bins))
        report["nll" + suffix] = float(nll(logits_NC, y_N, w_N))
        report["accuracy" + suffix] = float(accuracy(logits_NC, y_N, w_N))
    return report
