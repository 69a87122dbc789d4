"""One pre-norm transformer block: x + attn(norm(x)); x + MLP(norm(x)), its norm and MLP kinds (GPT-2's or LLaMA's)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.model.attention import MultiHeadAttention
from attnlab.model.backward import dense_dot_general, gelu
from attnlab.model.groups import tag


def make_norm(kind: str, d_model: int, dtype, rngs) -> nnx.Module:
    """A LayerNorm (scale and bias) or an RMSNorm (scale only) over the last axis."""
    cls = nnx.LayerNorm if kind == "layernorm" else nnx.RMSNorm
    return cls(d_model, dtype=dtype, rngs=rngs)


def mlp_bias(bias: bool | None, mlp: str) -> bool:
    """Whether the MLP's linear layers have biases: model.bias, or where it is null the MLP kind's own (GPT-2's GELU
    and the ReLU MLP have them, LLaMA's SwiGLU none)."""
    return mlp != "swiglu" if bias is None else bias


def swiglu_width(mlp_ratio: int, d_model: int) -> int:
    """SwiGLU's hidden width: 2/3 of the GELU MLP's, so its three matrices hold about the parameters of GELU's two;
    rounded up to a multiple of 64 (LLaMA rounds 8d/3 up to a multiple of 256; 64 keeps small models small)."""
    return -(-2 * mlp_ratio * d_model // 3 // 64) * 64


class Block(nnx.Module):
    """x + attn(norm(x)); x + MLP(norm(x)) (left out at mlp_ratio 0): norm a LayerNorm or an RMSNorm, MLP
    fc2(gelu(fc1 x)), fc2(relu(fc1 x)) or fc2(silu(gate x) · up x) (SwiGLU: fc1 holds gate and up side by side)."""

    def __init__(
        self,
        d_model,
        num_heads,
        mlp_ratio,
        dropout,
        make_normalizer,
        *,
        use_rope,
        qk_norm,
        seq_len,
        dtype,
        rngs,
        short_conv=0,
        output_gate="none",
        norm="layernorm",
        mlp="gelu",
        bias=None,
    ):
        self.mlp = mlp
        self.ln1 = make_norm(norm, d_model, dtype, rngs)
        self.attn = MultiHeadAttention(
            d_model,
            num_heads,
            make_normalizer,
            use_rope=use_rope,
            qk_norm=qk_norm,
            seq_len=seq_len,
            dtype=dtype,
            rngs=rngs,
            short_conv=short_conv,
            output_gate=output_gate,
        )
        self.drop = nnx.Dropout(dropout, rngs=rngs)
        tag("norm", self.ln1)
        self.has_mlp = mlp_ratio > 0  # 0: an attention-only block (Elhage et al. 2021)
        if self.has_mlp:
            self.ln2 = make_norm(norm, d_model, dtype, rngs)
            hidden = swiglu_width(mlp_ratio, d_model) if mlp == "swiglu" else mlp_ratio * d_model
            wide = 2 * hidden if mlp == "swiglu" else hidden  # SwiGLU: the gate's and the up projection's columns
            bias = mlp_bias(bias, mlp)
            self.fc1 = nnx.Linear(d_model, wide, use_bias=bias, dtype=dtype, dot_general=dense_dot_general, rngs=rngs)
            self.fc2 = nnx.Linear(hidden, d_model, use_bias=bias, dtype=dtype, dot_general=dense_dot_general, rngs=rngs)
            tag("norm", self.ln2)
            tag("mlp", self.fc1, self.fc2)

    def activation(self, u_BTF):
        """GELU or ReLU of the hidden units, or SwiGLU's silu(gate) · up of their two halves."""
        if self.mlp == "gelu":
            return gelu(u_BTF)
        if self.mlp == "relu":
            return jax.nn.relu(u_BTF)
        gate_BTF, up_BTF = jnp.split(u_BTF, 2, axis=-1)
        return jax.nn.silu(gate_BTF) * up_BTF

    def __call__(self, x_BTD, mask, *, with_stats, score_probe_BNTS, deterministic, rngs):
        """(the residual stream after the block, its attention's statistics, and with them (`with_stats`) each token's
        value norm ‖v_t‖ per head, (B,N,T): statistics.residual's value-state drain; None without)."""
        u_BTD = self.ln1(x_BTD)
        q, k, v = self.attn.heads(u_BTD, mask)
        a_BTD, stats = self.attn.attend(
            u_BTD, q, k, v, mask, with_stats=with_stats, score_probe_BNTS=score_probe_BNTS, training=not deterministic
        )
        x_BTD = x_BTD + self.drop(a_BTD, deterministic=deterministic, rngs=rngs)
        if self.has_mlp:
            h = self.fc2(self.activation(self.fc1(self.ln2(x_BTD))))
            x_BTD = x_BTD + self.drop(h, deterministic=deterministic, rngs=rngs)
        value_norm_BNT = jnp.linalg.norm(v.astype(jnp.float32), axis=-1) if with_stats else None
        return x_BTD, stats, value_norm_BNT
