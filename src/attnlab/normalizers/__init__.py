"""Attention normalizers behind one contract (see `Normalizer`), built by name from configs/normalizer/."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from attnlab import construct

from .base import (
    CORE_STATS,
    FixedFeatures,
    InverseTemperature,
    Normalizer,
    NormalizerParam,
    ScoreNormalizer,
    core_stats,
    softmax_stats,
)
from .contract import FROM_ATTENTION
from .entmax import Entmax, entmax
from .exponential import KL, Softmax, Softmax1
from .forgetting import Forgetting
from .linear import Linear
from .mask import Mask, as_mask, masked_softmax
from .pointwise import ReLU, Sigmoid
from .scalable import SSMax
from .sink import Sink
from .softpick import Softpick
from .squared import Squared
from .stickbreaking import StickBreaking

__all__ = [
    "CORE_STATS",
    "KL",
    "Entmax",
    "FixedFeatures",
    "Forgetting",
    "InverseTemperature",
    "Linear",
    "Mask",
    "Normalizer",
    "NormalizerParam",
    "ReLU",
    "SSMax",
    "ScoreNormalizer",
    "Sigmoid",
    "Sink",
    "Softmax",
    "Softmax1",
    "Softpick",
    "Squared",
    "StickBreaking",
    "as_mask",
    "attend",
    "attention_weights",
    "build",
    "core_stats",
    "entmax",
    "masked_softmax",
    "softmax_stats",
]


def build(name: str, *, num_heads: int, head_dim: int, rngs: nnx.Rngs | None = None, **options) -> Normalizer:
    """The named normalizer from its YAML defaults updated by `options`."""
    make = construct.build_choice("normalizer", name, options, deferred=FROM_ATTENTION)
    return make(num_heads=num_heads, head_dim=head_dim, rngs=rngs or nnx.Rngs(0))


def _heads_major(x_BTNH):
    """(B,T,N,H) ↔ (B,N,T,H): the public functions speak jax.nn.dot_product_attention's layout."""
    return jnp.swapaxes(x_BTNH, 1, 2)


def attend(name: str, q_BTNH, k_BSNH, v_BSNH, mask=None, *, causal=False, with_stats=True, **options):
    """(out_BTNH, stats) of the named normalizer; mask is None, a `Mask` or a boolean (B,T,S) / (B,N,T,S) array."""
    norm = build(name, num_heads=q_BTNH.shape[2], head_dim=q_BTNH.shape[3], **options)
    q_BNTH, k_BNSH, v_BNSH = (_heads_major(x) for x in (q_BTNH, k_BSNH, v_BSNH))
    out_BNTH, stats = norm(
        q_BNTH, k_BNSH, v_BNSH, as_mask(mask, causal, _shape_BNTS(q_BTNH, k_BSNH)), with_stats=with_stats
    )
    return _heads_major(out_BNTH), stats


def attention_weights(name: str, q_BTNH, k_BSNH, mask=None, *, causal=False, **options):
    """The explicit (B,N,T,S) attention matrix of the named normalizer."""
    norm = build(name, num_heads=q_BTNH.shape[2], head_dim=q_BTNH.shape[3], **options)
    return norm.weights(_heads_major(q_BTNH), _heads_major(k_BSNH), as_mask(mask, causal, _shape_BNTS(q_BTNH, k_BSNH)))


def _shape_BNTS(q_BTNH, k_BSNH) -> tuple[int, int, int, int]:
    return q_BTNH.shape[0], q_BTNH.shape[2], q_BTNH.shape[1], k_BSNH.shape[1]
