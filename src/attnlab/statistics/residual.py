"""The residual stream's statistics (Transformer.extreme_token_stats), from each block's output and its tokens' value
norms: the massive-activation ratio and kurtosis of the output (Sun et al. 2024; Zuhri et al. 2025), and Guo et al.
2024's value-state drain and residual-state peak (arXiv 2410.13835, Sec. 2). Each (L, N), a per-layer one repeated
per head, as the per-head statistics the blocks return."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def residual_outliers(x_BTD, valid_BT):
    """(largest |x| / median |x|, kurtosis E[(x − μ)⁴] / σ⁴) over every entry of the valid tokens' residual stream.

    The first is Sun et al. 2024's massive-activation measure (their outliers are ~10⁴ times the median); the
    second the hidden-state kurtosis Zuhri et al. 2025 report for softpick (Pearson's: 3 for a Gaussian)."""
    x_BTD = x_BTD.astype(jnp.float32)
    w_BT1 = jnp.broadcast_to(valid_BT[..., None], x_BTD.shape[:2] + (1,)).astype(bool)
    abs_BTD = jnp.where(w_BT1, jnp.abs(x_BTD), jnp.nan)
    ratio = jnp.nanmax(abs_BTD) / jnp.maximum(jnp.nanmedian(abs_BTD), 1e-30)
    count = jnp.maximum(w_BT1.sum() * x_BTD.shape[-1], 1)
    mean = jnp.where(w_BT1, x_BTD, 0.0).sum() / count
    c_BTD = jnp.where(w_BT1, x_BTD - mean, 0.0)
    var = (c_BTD**2).sum() / count
    return ratio, (c_BTD**4).sum() / count / jnp.maximum(var**2, 1e-30)


def first_over_median(norm_XT, valid_XT) -> jax.Array:
    """(X,) the first position's norm over the median norm of the other valid positions (NaN where there is none):
    the value-state drain and residual-state peak of Guo et al. 2024 (arXiv 2410.13835, Sec. 2), per example."""
    others_XT = jnp.where(valid_XT[..., 1:], norm_XT[..., 1:].astype(jnp.float32), jnp.nan)
    return norm_XT[..., 0].astype(jnp.float32) / jnp.maximum(jnp.nanmedian(others_XT, -1), 1e-30)


def mean_over_examples(value_BX, valid_BT) -> jax.Array:
    """(X...) the mean of per-example values over the examples with two or more valid tokens (0 where none)."""
    ok_B = valid_BT.sum(-1) >= 2
    ok_BX = ok_B.reshape(ok_B.shape + (1,) * (value_BX.ndim - 1))
    return jnp.where(ok_BX, value_BX, 0.0).sum(0) / jnp.maximum(ok_B.sum(), 1)


def drain_and_peak(value_norm_LBNT, residual_norm_LBT, valid_BT) -> dict:
    """{"value_drain", "residual_peak": (L, N)}: the first token's norm over the median of the other valid tokens',
    mean over examples, of each head's values and of the residual stream. One median over every layer at once: a
    sort per layer and statistic made the GPU logging step launch 1.83× the plain step's kernels, against 1.67×
    without these statistics (BENCHMARKS.md)."""
    N = value_norm_LBNT.shape[2]
    norms_BLMT = jnp.concatenate([value_norm_LBNT, residual_norm_LBT[:, :, None]], axis=2).swapaxes(0, 1)
    ratio_LM = mean_over_examples(first_over_median(norms_BLMT, valid_BT[:, None, None]), valid_BT)
    return {"value_drain": ratio_LM[:, :N], "residual_peak": jnp.broadcast_to(ratio_LM[:, N:], ratio_LM[:, :N].shape)}


def residual_statistics(outputs_BTD: list, value_norms_BNT: list, valid_BT) -> dict:
    """{"massive_ratio", "kurtosis", "value_drain", "residual_peak": (L, N)} from each block's output (the residual
    stream it leaves) and the value norms of its tokens, over the valid tokens."""
    N = value_norms_BNT[0].shape[1]
    outliers = [residual_outliers(x_BTD, valid_BT) for x_BTD in outputs_BTD]  # one median per layer
    residual_norm_LBT = jnp.stack([jnp.linalg.norm(x.astype(jnp.float32), axis=-1) for x in outputs_BTD])
    return {
        "massive_ratio": jnp.stack([jnp.full((N,), ratio) for ratio, _ in outliers]),
        "kurtosis": jnp.stack([jnp.full((N,), kurtosis) for _, kurtosis in outliers]),
        **drain_and_peak(jnp.stack(value_norms_BNT), residual_norm_LBT, valid_BT),
    }
