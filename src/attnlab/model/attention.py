"""Multi-head attention around a pluggable normalizer, with optional RoPE and QK-normalisation."""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.model.backward import dense_dot_general
from attnlab.model.groups import tag
from attnlab.normalizers import Mask, Normalizer


def rope(x_BNTH, positions_T, base: float = 10000.0):
    """Rotary position embedding (Su et al. 2021), rotating pairs (i, i + H/2)."""
    H = x_BNTH.shape[-1]
    inv_freq = base ** (-jnp.arange(0, H // 2, dtype=jnp.float32) / (H // 2))
    ang_TF = positions_T[:, None].astype(jnp.float32) * inv_freq[None]
    cos, sin = jnp.cos(ang_TF)[None, None], jnp.sin(ang_TF)[None, None]
    x1, x2 = x_BNTH[..., : H // 2], x_BNTH[..., H // 2 : 2 * (H // 2)]
    rot = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x_BNTH[..., 2 * (H // 2) :]], -1)
    return rot.astype(x_BNTH.dtype)


def rope_parts(x_BNTH, positions_T, parts: int):
    """RoPE on each of `parts` equal slices of the head dim on its own (a normalizer whose score maps read q and k
    by parts: `qk_split`), the remaining channels of an uneven split unrotated; parts = 1 is `rope`."""
    if parts == 1:
        return rope(x_BNTH, positions_T)
    w = x_BNTH.shape[-1] // parts
    rotated = [rope(x_BNTH[..., i * w : (i + 1) * w], positions_T) for i in range(parts)]
    return jnp.concatenate([*rotated, x_BNTH[..., parts * w :]], -1)


class ShortConv(nnx.Module):
    """Depthwise 1-D convolution of width k over time, then SiLU, on the (B,T,C) q/k/v projections.

    Follows flash-linear-attention's ShortConvolution (fla/modules/convolution.py: depthwise Conv1d,
    no bias, SiLU, padded positions zeroed first), used on q, k and v by Based and fla's linear-attention
    layers (Zoology/H3 use the same short causal filter). Causal (left padding k−1) for per-token
    tasks; centred (⌊(k−1)/2⌋ left, the rest right) for per-sequence tasks.
    """

    def __init__(self, channels: int, width: int, *, dtype, rngs: nnx.Rngs):
        # PyTorch's Conv1d default init for a depthwise filter: U(±1/√fan_in), fan_in = width.
        bound = 1.0 / math.sqrt(width)
        self.kernel = nnx.Param(jax.random.uniform(rngs.params(), (width, channels), jnp.float32, -bound, bound))
        self.width, self.dtype = width, dtype
        tag("attention", self)

    def __call__(self, x_BTC, valid_BT, causal: bool):
        if valid_BT is not None:  # padding must never reach a valid position
            x_BTC = x_BTC * valid_BT[..., None].astype(x_BTC.dtype)
        k, T = self.width, x_BTC.shape[1]
        left = k - 1 if causal else (k - 1) // 2
        xp_BTC = jnp.pad(x_BTC, ((0, 0), (left, k - 1 - left), (0, 0)))
        w_KC = self.kernel[...].astype(x_BTC.dtype)
        # y_t = Σ_j w_j · x_{t − left + j}: a sum of k shifted copies (k is small, 2–8).
        y_BTC = sum(w_KC[None, j : j + 1] * xp_BTC[:, j : j + T] for j in range(k))
        return jax.nn.silu(y_BTC)


class MultiHeadAttention(nnx.Module):
    """q, k, v projections → normalizer → output gate (none: off) → output projection; returns (y_BTD, stats)."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        make_normalizer: Callable[..., Normalizer],
        *,
        use_rope: bool,
        qk_norm: bool,
        seq_len: int,
        dtype,
        rngs: nnx.Rngs,
        short_conv: int = 0,
        output_gate: str = "none",
    ):
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.qkv = nnx.Linear(
            d_model, 3 * d_model, use_bias=False, dtype=dtype, dot_general=dense_dot_general, rngs=rngs
        )
        self.out = nnx.Linear(d_model, d_model, use_bias=False, dtype=dtype, dot_general=dense_dot_general, rngs=rngs)
        self.normalizer = make_normalizer(num_heads=num_heads, head_dim=self.head_dim, rngs=rngs)
        self.use_rope, self.qk_norm = use_rope, qk_norm
        if short_conv:
            self.conv = ShortConv(3 * d_model, short_conv, dtype=dtype, rngs=rngs)
        if qk_norm:
            # QK-norm (Henry et al. 2020): one learnable g per layer, initialised to log2(L² − L).
            # q̂ is scaled by g·√H so that the normalizer's default β = 1/√H yields exactly g. The gain belongs to
            # the model, not the normalizer: the attention group, and like LayerNorm scales not weight-decayed.
            self.qk_gain = nnx.Param(jnp.array(math.log2(max(seq_len**2 - seq_len, 2)), jnp.float32))
        # the normalizer's own parameters are NormalizerParam (the normalizer group by type); a projection of the
        # layer input that a normalizer owns (forgetting attention's gate) is an attention weight
        tag("attention", self.qkv, self.out, *([self.qk_gain] if qk_norm else []), self.normalizer)
        self.output_gate = output_gate
        if output_gate != "none":
            width = num_heads if output_gate == "headwise" else d_model
            self.gate = nnx.Linear(
                d_model, width, use_bias=False, dtype=dtype, dot_general=dense_dot_general, rngs=rngs
            )
            tag("attention", self.gate)

    def gated(self, o_BNTH, x_BTD, mask: Mask, with_stats: bool):
        """o ⊙ σ(x·W_θ) per head (Qiu et al. 2025, Eq. 5), and with statistics the mean gate per head over the
        valid tokens (`gate_mean`: the paper's Figure 5 measures how sparse the gates become)."""
        B, T, _ = x_BTD.shape
        g_BTG = jax.nn.sigmoid(self.gate(x_BTD).astype(jnp.float32))
        if self.output_gate == "headwise":
            g_BNTH = g_BTG.transpose(0, 2, 1)[..., None]
        else:
            g_BNTH = g_BTG.reshape(B, T, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)
        gated_BNTH = (o_BNTH.astype(jnp.float32) * g_BNTH).astype(o_BNTH.dtype)
        if not with_stats:
            return gated_BNTH, {}
        valid_B1T = jnp.ones((B, 1, T)) if mask.key_valid_BS is None else mask.key_valid_BS[:, None, :T]
        w_B1T = jnp.broadcast_to(valid_B1T, (B, 1, T)).astype(jnp.float32)
        mean_N = (g_BNTH.mean(-1) * w_B1T).sum((0, 2)) / jnp.maximum(w_B1T.sum((0, 2)), 1.0)
        return gated_BNTH, {"gate_mean": mean_N}

    def heads(self, x_BTD, mask: Mask):
        """Project to heads-major q, k, v (B,N,T,H), with the short convolution, QK-norm and RoPE applied."""
        B, T, _ = x_BTD.shape
        qkv_BTC = self.qkv(x_BTD)
        if hasattr(self, "conv"):
            qkv_BTC = self.conv(qkv_BTC, mask.key_valid_BS, mask.causal)
        # One transpose of the (B,T,3D) projection puts every head's T×H block contiguous, so the
        # normalizer's products batch over (b, n) without copies (docs/DECISIONS.md, "Heads-major normalizer contract").
        q, k, v = qkv_BTC.reshape(B, T, 3, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        if self.qk_norm:
            q = q * jax.lax.rsqrt(jnp.sum(q.astype(jnp.float32) ** 2, -1, keepdims=True) + 1e-6).astype(q.dtype)
            k = k * jax.lax.rsqrt(jnp.sum(k.astype(jnp.float32) ** 2, -1, keepdims=True) + 1e-6).astype(k.dtype)
            q = q * (self.qk_gain[...] * math.sqrt(self.head_dim)).astype(q.dtype)
        if self.use_rope:
            pos_T = jnp.arange(T)
            q, k = (rope_parts(x, pos_T, self.normalizer.qk_split) for x in (q, k))
        return q, k, v

    def layer_input(self, x_BTD) -> dict:
        """The keyword a normalizer that `takes_layer_input` is given (its gates projected from x); {} otherwise."""
        return {"layer_input_BTD": x_BTD} if self.normalizer.takes_layer_input else {}

    def weights(self, x_BTD, mask: Mask):
        """The explicit (B,N,T,S) attention matrix of this layer."""
        q, k, _ = self.heads(x_BTD, mask)
        return self.normalizer.weights(q, k, mask, **self.layer_input(x_BTD))

    def __call__(self, x_BTD, mask: Mask, *, with_stats=False, score_probe_BNTS=None, training=False):
        q, k, v = self.heads(x_BTD, mask)
        return self.attend(
            x_BTD, q, k, v, mask, with_stats=with_stats, score_probe_BNTS=score_probe_BNTS, training=training
        )

    def attend(self, x_BTD, q, k, v, mask: Mask, *, with_stats=False, score_probe_BNTS=None, training=False):
        """(out_BTD, stats) from this layer's heads q, k, v of x (`heads`)."""
        B, T, _ = x_BTD.shape
        kwargs = self.layer_input(x_BTD) | ({} if score_probe_BNTS is None else {"score_probe_BNTS": score_probe_BNTS})
        if self.normalizer.mode_dependent:
            kwargs["training"] = training
        o_BNTH, stats = self.normalizer(q, k, v, mask, with_stats=with_stats, **kwargs)
        if self.output_gate != "none":
            o_BNTH, gate_stats = self.gated(o_BNTH, x_BTD, mask, with_stats)
            stats = {**stats, **gate_stats}
        return self.out(o_BNTH.transpose(0, 2, 1, 3).reshape(B, T, -1)), stats
