"""Multi-head attention around a pluggable normalizer, with optional RoPE and QK-normalisation."""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.normalizers import Mask, Normalizer, NormalizerParam


def rope(x_BNTH, positions_T, base: float = 10000.0):
    """Rotary position embedding (Su et al. 2021), rotating pairs (i, i + H/2)."""
    H = x_BNTH.shape[-1]
    inv_freq = base ** (-jnp.arange(0, H // 2, dtype=jnp.float32) / (H // 2))
    ang_TF = positions_T[:, None].astype(jnp.float32) * inv_freq[None]
    cos, sin = jnp.cos(ang_TF)[None, None], jnp.sin(ang_TF)[None, None]
    x1, x2 = x_BNTH[..., : H // 2], x_BNTH[..., H // 2 : 2 * (H // 2)]
    rot = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x_BNTH[..., 2 * (H // 2):]], -1)
    return rot.astype(x_BNTH.dtype)


class MultiHeadAttention(nnx.Module):
    """q, k, v projections → normalizer → output projection; returns (y_BTD, stats)."""

    def __init__(self, d_model: int, num_heads: int, make_normalizer: Callable[..., Normalizer], *,
                 use_rope: bool, qk_norm: bool, seq_len: int, dtype, rngs: nnx.Rngs):
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.qkv = nnx.Linear(d_model, 3 * d_model, use_bias=False, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, use_bias=False, dtype=dtype, rngs=rngs)
        self.normalizer = make_normalizer(num_heads=num_heads, head_dim=self.head_dim, rngs=rngs)
        self.use_rope, self.qk_norm = use_rope, qk_norm
        if qk_norm:
            # QK-norm (Henry et al. 2020): one learnable g per layer, initialised to log2(L² − L).
            # q̂ is scaled by g·√H so that the normalizer's default β = 1/√H yields exactly g.
            self.qk_gain = NormalizerParam(jnp.array(math.log2(max(seq_len**2 - seq_len, 2)), jnp.float32))

    def heads(self, x_BTD):
        """Project to heads-major q, k, v (B,N,T,H), with QK-norm and RoPE applied."""
        B, T, _ = x_BTD.shape
        # One transpose of the (B,T,3D) projection puts every head's T×H block contiguous, so the
        # normalizer's products batch over (b, n) without copies (docs/ARCHITECTURE.md, "Layout").
        q, k, v = self.qkv(x_BTD).reshape(B, T, 3, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        if self.qk_norm:
            q = q * jax.lax.rsqrt(jnp.sum(q.astype(jnp.float32) ** 2, -1, keepdims=True) + 1e-6).astype(q.dtype)
            k = k * jax.lax.rsqrt(jnp.sum(k.astype(jnp.float32) ** 2, -1, keepdims=True) + 1e-6).astype(k.dtype)
            q = q * (self.qk_gain[...] * math.sqrt(self.head_dim)).astype(q.dtype)
        if self.use_rope:
            pos_T = jnp.arange(T)
            q, k = rope(q, pos_T), rope(k, pos_T)
        return q, k, v

    def weights(self, x_BTD, mask: Mask):
        """The explicit (B,N,T,S) attention matrix of this layer."""
        q, k, _ = self.heads(x_BTD)
        return self.normalizer.weights(q, k, mask)

    def __call__(self, x_BTD, mask: Mask, *, with_stats=False, score_probe_BNTS=None):
        B, T, _ = x_BTD.shape
        q, k, v = self.heads(x_BTD)
        kwargs = {} if score_probe_BNTS is None else {"score_probe_BNTS": score_probe_BNTS}
        o_BNTH, stats = self.normalizer(q, k, v, mask, with_stats=with_stats, **kwargs)
        return self.out(o_BNTH.transpose(0, 2, 1, 3).reshape(B, T, -1)), stats
