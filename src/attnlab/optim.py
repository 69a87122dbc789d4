"""AdamW under warmup + cosine decay with global-norm clipping; normalizer parameters are not decayed."""

from __future__ import annotations

import jax
import optax
from flax import nnx

from attnlab.normalizers import NormalizerParam


def decay_mask(params: nnx.State):
    """True for weight matrices; False for biases, norms and every NormalizerParam (β, priors, slopes).

    Decay on a raw β pulls attention towards uniform (LITERATURE.md, cross-cutting).
    """
    variables = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    flags = [not isinstance(v, NormalizerParam) and v[...].ndim >= 2 for v in variables]
    return jax.tree.unflatten(jax.tree.structure(params), flags)


def schedule(lr: float, warmup_steps: int, total_steps: int, final_fraction: float = 0.1):
    """Linear warmup to lr, then cosine decay to final_fraction·lr."""
    return optax.warmup_cosine_decay_schedule(
        0.0, lr, max(warmup_steps, 1), max(total_steps, warmup_steps + 1), end_value=lr * final_fraction
    )


def make_optimizer(params: nnx.State, *, lr: float, warmup_steps: int, total_steps: int, weight_decay: float,
                   clip_norm: float, b1: float, b2: float, final_fraction: float = 0.1):
    """optax chain: clip by global norm, then AdamW with the decay mask and schedule."""
    return optax.chain(
        optax.clip_by_global_norm(clip_norm),
        optax.adamw(schedule(lr, warmup_steps, total_steps, final_fraction), b1=b1, b2=b2,
                    weight_decay=weight_decay, mask=decay_mask(params)),
    )
