"""Causal linear attention as fused Pallas kernels: one forward, one backward.

out_t = num_t / (den_t + eps) with num_t = Σ_{s≤t} (φ(q_t)·φ(k_s)) v_s and den_t = Σ_{s≤t} φ(q_t)·φ(k_s), by
flash-linear-attention's
fused_chunk scheme (Yang et al. 2024, "Gated Linear Attention Transformers with Hardware-Efficient Training";
fla/ops/linear_attn/fused_chunk.py): one program per (batch, head) walks the chunks of C rows in order,
holding the state S = Σ φ(k)ᵀv (F×H) and z = Σ φ(k) (F) in float32 registers; per chunk the intra-chunk
causal quadratic form plus φ(q)·S, so neither a T×T array nor one state per chunk reaches memory. The backward
kernel walks the chunks forward for dφ(q) (states S, z) and then backward for dφ(k) and dv (states
dS = Σ φ(q)ᵀ dnum, dz = Σ φ(q) dden). Operands in the compute dtype, accumulation in float32; like
Linear._chunked, the intra-chunk weights and the state are rounded to the compute dtype before they meet v
and φ(q), and the denominator sums the rounded weights.

The forward kernel divides (fla's fused_chunk leaves that to normalize_output, outside) and writes the output in
(B,T,N,H), the layout the output projection reads: the backward takes d num = g/d and d den = −Σₕ g·out/d
(d = den + eps) from that output and den, inside the backward kernel, so a layer keeps one (B,T,N,H) array for both
backwards where a separate division would keep the numerator beside the projection's transposed copy
(BENCHMARKS.md).

Written with the generic Pallas API on its Triton backend, as pallas_sigmoid.py (which says why not Mosaic GPU);
`interpret=True` runs it on a CPU. The feature maps stay outside (XLA fuses them into the kernels' operands).
Masks: causal with T = S; key validity is Linear's zeroing of φ(k) before the call.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .mask import Mask
from .pallas_sigmoid import MIN_GPU_TILE, _matmul, _tile

F32 = jnp.float32
SAVED = ("pallas_linear_out", "pallas_linear_den")  # checkpoint names of what the backward reads


def attention(qf_BNTF, kf_BNTF, v_BNTH, chunk_size: int, eps: float, *, interpret: bool = False):
    """The output (B,N,T,H) in v's dtype of causal linear attention on features φ(q), φ(k), cast to v's dtype for
    the kernels' matmuls: num/(den + eps), 0 in a row where that is 0/0 (eps = 0, no admissible key). The
    numerator is rounded to the compute dtype before the float32 division, as a separate division of fla's
    fused_chunk output would see it."""
    _check(qf_BNTF, kf_BNTF, v_BNTH, interpret)
    T = qf_BNTF.shape[2]
    C = _tile(chunk_size, T, interpret)
    Tp = -(-T // C) * C  # padded rows have φ(k) = 0 and v = 0: they add nothing; their outputs are dropped
    pad = lambda x: jnp.pad(x.astype(v_BNTH.dtype), ((0, 0), (0, 0), (0, Tp - T), (0, 0)))  # noqa: E731
    out_BTNH = _make_attention(C, eps, interpret)(pad(qf_BNTF), pad(kf_BNTF), pad(v_BNTH))
    return out_BTNH[:, :T].transpose(0, 2, 1, 3)


def dim_problem(name: str, size: int | None, *, interpret: bool = False) -> str | None:
    """Why the kernels cannot take a feature or head dim of `size`, or None if they can."""
    if not interpret and (size is None or size < MIN_GPU_TILE or size & (size - 1)):
        # Pallas's Triton lowering takes power-of-two arrays only, and Triton's dot no dimension under 16.
        return f"{name} {size} (the Triton kernels need a power of two ≥ {MIN_GPU_TILE})"
    return None


def input_problem(head_dim: int | None, mask: Mask, T: int, S: int, *, interpret: bool = False) -> str | None:
    """Why the kernels cannot take this head dim or mask, or None if they can (impl.choose asks at build)."""
    if mask.has_dense or mask.window is not None or not mask.causal or T != S:
        return (
            "the kernels compute causal attention with T = S only (key padding allowed); got "
            f"causal={mask.causal}, window={mask.window}, dense mask={mask.has_dense}, T={T}, S={S}"
        )
    return dim_problem("head dim", head_dim, interpret=interpret)


def _check(qf_BNTF, kf_BNTF, v_BNTH, interpret: bool) -> None:
    """Refuse what the kernels do not compute, naming what they do."""
    if qf_BNTF.shape != kf_BNTF.shape or qf_BNTF.shape[:3] != v_BNTH.shape[:3]:
        raise ValueError(
            "pallas_linear needs φ(q), φ(k) of one shape (B,N,T,F) and v (B,N,T,H) with T = S; got "
            f"{qf_BNTF.shape}, {kf_BNTF.shape}, {v_BNTH.shape}"
        )
    why = dim_problem("feature dim", qf_BNTF.shape[3], interpret=interpret) or dim_problem(
        "head dim", v_BNTH.shape[3], interpret=interpret
    )
    if why is not None:
        raise ValueError(f"pallas_linear cannot run: {why}")


def _causal(C: int):
    """(C, C) True where the row (query) is at or after the column (key)."""
    return lax.broadcasted_iota(jnp.int32, (C, C), 0) >= lax.broadcasted_iota(jnp.int32, (C, C), 1)


def _forward_kernel(C, eps, q_ref, k_ref, v_ref, out_ref, den_ref):
    dtype, causal = v_ref.dtype, _causal(C)

    def body(i, carry):
        s_FH, z_F = carry
        rows = pl.ds(i * C, C)
        q, k, v = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :]
        a_CC = jnp.where(causal, _matmul(q, k, 1, 1), 0.0).astype(dtype)
        num = (_matmul(a_CC, v, 1, 0) + _matmul(q, s_FH.astype(dtype), 1, 0)).astype(dtype)
        den = jnp.sum(a_CC.astype(F32), axis=1) + jnp.sum(q.astype(F32) * z_F[None, :], axis=1)
        out_ref[rows, :] = (num.astype(F32) * _inverse(den, eps)[:, None]).astype(dtype)
        den_ref[rows] = den
        return s_FH + _matmul(k, v, 0, 0), z_F + jnp.sum(k.astype(F32), axis=0)

    F, H = q_ref.shape[1], v_ref.shape[1]
    lax.fori_loop(0, q_ref.shape[0] // C, body, (jnp.zeros((F, H), F32), jnp.zeros((F,), F32)))


def _inverse(den, eps: float):
    """1/(den + eps), 0 where that is 0 (eps = 0: a row with no admissible key)."""
    d = den + eps
    return jnp.where(d > 0, 1.0 / jnp.where(d > 0, d, 1.0), 0.0)


def _backward_kernel(C, eps, q_ref, k_ref, v_ref, g_ref, out_ref, den_ref, dq_ref, dk_ref, dv_ref):
    """From the output's cotangent g: dnum = g/d, dden = −Σₕ g·out/d (d = den + eps); then dA_ts = dnum_t·v_s + dden_t
    (s ≤ t): dq = dA·k + dnum·Sᵀ + dden·z, dk = dAᵀ·q + v·dSᵀ + dz, dv = Aᵀ·dnum + k·dS, with S, z the states of the
    chunks before and dS, dz those of the chunks after."""
    dtype, causal, n_chunks = v_ref.dtype, _causal(C), q_ref.shape[0] // C
    F, H = q_ref.shape[1], v_ref.shape[1]

    def load(i):
        rows = pl.ds(i * C, C)
        q, k, v = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :]
        g, inv = g_ref[rows, :].astype(F32), _inverse(den_ref[rows], eps)
        dnum, dden = (g * inv[:, None]).astype(dtype), -jnp.sum(g * out_ref[rows, :].astype(F32), axis=1) * inv
        da_CC = jnp.where(causal, _matmul(dnum, v, 1, 1) + dden[:, None], 0.0)
        return rows, q, k, v, dnum, dden, da_CC

    def dq_body(i, carry):
        s_FH, z_F = carry
        rows, q, k, v, dnum, dden, da_CC = load(i)
        dq = _matmul(da_CC.astype(dtype), k, 1, 0) + _matmul(dnum, s_FH.astype(dtype), 1, 1)
        dq_ref[rows, :] = (dq + dden[:, None] * z_F[None, :]).astype(dq_ref.dtype)
        return s_FH + _matmul(k, v, 0, 0), z_F + jnp.sum(k.astype(F32), axis=0)

    def dkdv_body(n, carry):
        ds_FH, dz_F = carry
        rows, q, k, v, dnum, dden, da_CC = load(n_chunks - 1 - n)
        a_CC = jnp.where(causal, _matmul(q, k, 1, 1), 0.0).astype(dtype)
        dk = _matmul(da_CC.astype(dtype), q, 0, 0) + _matmul(v, ds_FH.astype(dtype), 1, 1) + dz_F[None, :]
        dv = _matmul(a_CC, dnum, 0, 0) + _matmul(k, ds_FH.astype(dtype), 1, 0)
        dk_ref[rows, :], dv_ref[rows, :] = dk.astype(dk_ref.dtype), dv.astype(dv_ref.dtype)
        return ds_FH + _matmul(q, dnum, 0, 0), dz_F + jnp.sum(q.astype(F32) * dden[:, None], axis=0)

    lax.fori_loop(0, n_chunks, dq_body, (jnp.zeros((F, H), F32), jnp.zeros((F,), F32)))
    lax.fori_loop(0, n_chunks, dkdv_body, (jnp.zeros((F, H), F32), jnp.zeros((F,), F32)))


def _make_attention(C: int, eps: float, interpret: bool):
    """The custom-VJP function (φ(q), φ(k), v) -> out (B,Tp,N,H) on padded operands."""

    def call(kernel, out_shape, *operands, btnh=()):
        B, N = operands[0].shape[:2]

        def whole(x, i):
            if i in btnh:  # (B,T,N,H): one head's rows are strided by N·H
                return pl.BlockSpec((None, x.shape[1], None, x.shape[3]), lambda b, n: (b, 0, n, 0))
            return pl.BlockSpec((None, None, *x.shape[2:]), lambda b, n: (b, n) + (0,) * (x.ndim - 2))

        return pl.pallas_call(
            kernel,
            out_shape=out_shape,
            grid=(B, N),
            in_specs=[whole(x, i) for i, x in enumerate(operands)],
            out_specs=tuple(whole(x, len(operands) + i) for i, x in enumerate(out_shape)),
            interpret=interpret,
            # Triton, named: a pallas_call without compiler parameters goes to Mosaic GPU in jax 0.10+.
            compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2),
        )(*operands)

    @jax.custom_vjp
    def fn(q, k, v):
        return fn_fwd(q, k, v)[0]

    def fn_fwd(q, k, v):
        B, N, T, H = v.shape
        shapes = (jax.ShapeDtypeStruct((B, T, N, H), v.dtype), jax.ShapeDtypeStruct(v.shape[:3], F32))
        out_BTNH, den_BNT = call(functools.partial(_forward_kernel, C, eps), shapes, q, k, v, btnh=(3,))
        out_BTNH, den_BNT = checkpoint_name(out_BTNH, SAVED[0]), checkpoint_name(den_BNT, SAVED[1])
        return out_BTNH, (q, k, v, out_BTNH, den_BNT)

    def fn_bwd(res, g_BTNH):
        q, k, v, out_BTNH, den_BNT = res
        shapes = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
        kernel = functools.partial(_backward_kernel, C, eps)
        return call(kernel, shapes, q, k, v, g_BTNH.astype(v.dtype), out_BTNH, den_BNT, btnh=(3, 4))

    fn.defvjp(fn_fwd, fn_bwd)
    return fn
