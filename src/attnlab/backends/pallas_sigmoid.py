"""Pointwise attention (sigmoid, ReLU) as fused Pallas kernels: one forward, two backward, no T×S array.

A pointwise normalizer weighs each key by its own score, w_ts = g(β_h·z_ts + c_t)·r_t with z = q·kᵀ,
a per-row offset c (sigmoid: −log n_t or a fixed bias) and a per-row factor r (ReLU: 1/n_t), so no
row statistic is carried across key blocks: the forward pass is FlashAttention without the running
max (FlashSigmoid: Ramapuram et al. 2024, "Theory, Analysis, and Best Practices for Sigmoid
Self-Attention", apple/ml-sigmoid-attention). The backward pass recomputes each block, one kernel
over key blocks for dk, dv and one over query blocks for dq and dβ (FlashAttention-2, Dao 2023);
there is no δ = dO·O term, the weights are not normalised over the row.

Written with the generic Pallas API (`pl.pallas_call`, BlockSpecs, `lax.dot_general` and elementwise
math on register tiles), which Pallas's Triton backend lowers (Ampere and later) and which runs on a
CPU with `interpret=True`. JAX recommends its Mosaic GPU backend instead (Hopper and later; the Triton
backend is deprecated from jax 0.11, Pallas changelog), but Mosaic GPU lowers no `dot_general`: its
matmuls are `plgpu.wgmma` on shared-memory operands, as in jax.experimental.pallas.ops.gpu.attention_mgpu.
Masks: causal, sliding window and key validity (any pattern, padding included), as the blockwise
form takes them; an explicit (B,T,S) or per-head mask is refused.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .blockwise import BlockForm, admissible_count_B1T
from .mask import Mask

# Rows and keys of one tile, a power of two: a (64, 64) f32 score block and (64, H) operands fit a Triton
# program's registers for H ≤ 128 (jax.experimental.pallas.ops.gpu.attention uses 64/128 blocks); Triton's
# dot takes no dimension under 16.
MAX_TILE, MIN_GPU_TILE = 64, 16
GATES = {jax.nn.sigmoid: "sigmoid", jax.nn.relu: "relu"}


def attention(form: BlockForm, q_BNTH, k_BNSH, v_BNSH, mask: Mask, block_size: int, *, interpret: bool = False):
    """The attended output (B,N,T,H) of a pointwise `form` by the fused kernels (tiles: `_tile`); blockwise.attention's
    signature, and `interpret` runs the kernels as JAX operations (on a CPU)."""
    _check(form, q_BNTH, v_BNSH, mask, interpret)
    B, N, T, H = q_BNTH.shape
    S = k_BNSH.shape[2]
    Q, K = _tile(block_size, T, interpret), _tile(block_size, S, interpret)
    Tp, Sp = -(-T // Q) * Q, -(-S // K) * K
    geo = _Geometry(T, S, Q, K, Tp, Sp, mask.causal, mask.window)
    n_B1T = jnp.broadcast_to(admissible_count_B1T(mask, T, S), (B, 1, T))
    offset_BT, factor_BT = _row_terms(form, n_B1T, T, S)
    valid_BS = jnp.ones((B, S)) if mask.key_valid_BS is None else jnp.broadcast_to(mask.key_valid_BS, (B, S))
    beta_N = form.params["beta"].astype(jnp.float32)
    rows = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, Tp - T), (0, 0)))  # noqa: E731
    keys = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, Sp - S), (0, 0)))  # noqa: E731
    fn = _make_attention(geo, GATES[form.gate], interpret)
    out_BNTH = fn(
        beta_N,
        rows(q_BNTH),
        keys(k_BNSH),
        keys(v_BNSH),
        jnp.pad(lax.stop_gradient(offset_BT), ((0, 0), (0, Tp - T))),
        jnp.pad(lax.stop_gradient(factor_BT), ((0, 0), (0, Tp - T))),
        jnp.pad(valid_BS.astype(jnp.float32), ((0, 0), (0, Sp - S))),
    )
    return out_BNTH[:, :, :T]


def problem(form: BlockForm | None, head_dim: int | None, mask: Mask, *, interpret: bool = False) -> str | None:
    """Why the kernels cannot compute this attention, or None if they can."""
    return form_problem(form) or input_problem(head_dim, mask, interpret=interpret)


def form_problem(form: BlockForm | None) -> str | None:
    """Why the kernels cannot compute this normalizer's form, or None if they can (impl.Capability.pallas)."""
    if form is None or form.kind != "count" or form.gate not in GATES or form.make is not None:
        return "the kernels compute pointwise forms only (sigmoid, relu)"
    if form.softcap is not None:
        return "the kernels compute βz themselves and take no soft cap"
    if set(form.params) != {"beta"}:
        return f"the kernels take the parameter beta only; got {sorted(form.params)}"
    return None


def input_problem(head_dim: int | None, mask: Mask, *, interpret: bool = False) -> str | None:
    """Why the kernels cannot take this head dim or mask, or None if they can (impl.choose asks at build)."""
    if not interpret and (head_dim is None or head_dim < MIN_GPU_TILE or head_dim & (head_dim - 1)):
        # Pallas's Triton lowering takes power-of-two arrays only, and Triton's dot no dimension under 16.
        return f"head dim {head_dim} (the Triton kernels need a power of two ≥ 16)"
    if mask.dense_BTS is not None or mask.dense_BNTS is not None:
        return "an explicit (B,T,S) or per-head mask (a T×S array; the kernels take causal, window, key validity)"
    return None


def _check(form: BlockForm, q_BNTH, v_BNSH, mask: Mask, interpret: bool) -> None:
    """Refuse what the kernels do not compute, naming what they do."""
    if q_BNTH.shape[-1] != v_BNSH.shape[-1]:
        raise ValueError(
            f"pallas_sigmoid.attention needs q and v of one head dim; got {q_BNTH.shape[-1]}, {v_BNSH.shape[-1]}"
        )
    why = problem(form, q_BNTH.shape[-1], mask, interpret=interpret)
    if why is not None:
        raise ValueError(f"pallas_sigmoid.attention cannot run: {why}")


def _tile(block_size: int, length: int, interpret: bool) -> int:
    """Rows (or keys) of a tile: the power of two ≤ block_size, ≤ MAX_TILE and < 2·length; ≥ 16 on a GPU."""
    tile = 1 << (min(block_size, MAX_TILE, 2 * length - 1).bit_length() - 1)
    return tile if interpret else max(tile, MIN_GPU_TILE)


def _row_terms(form: BlockForm, n_B1T, T: int, S: int):
    """(offset c, factor r), each (B,T) float32: x = β·z + c_t, w = g(x)·r_t.

    The form's logits are affine in z with slope β (Sigmoid: βz − log n or βz + bias; ReLU: βz), so
    c is the logits at β = 0; r = 1/max(n, 1) for a form divided by the row's key count.
    """
    B, N = n_B1T.shape[0], form.params["beta"].shape[0]
    q_pos, k_pos = jnp.arange(T) + (S - T), jnp.arange(S)
    at_zero = form.logits({"beta": jnp.zeros((N,))}, jnp.zeros((1, 1, 1, 1)), q_pos, k_pos, n_B1T[..., None])
    offset_BT = jnp.broadcast_to(at_zero, (B, N, T, 1))[:, 0, :, 0].astype(jnp.float32)
    factor_BT = 1.0 / jnp.maximum(n_B1T[:, 0], 1.0) if form.divide_by_count else jnp.ones((B, T))
    return offset_BT, factor_BT.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class _Geometry:
    T: int
    S: int
    Q: int
    K: int
    Tp: int
    Sp: int
    causal: bool
    window: int | None

    def key_blocks(self, i):
        """[lo, hi) of the key blocks query block i can see."""
        first, last = i * self.Q + (self.S - self.T), (i + 1) * self.Q - 1 + (self.S - self.T)
        lo, hi = 0, self.Sp // self.K
        if self.causal:
            hi = jnp.clip(last // self.K + 1, 0, hi)
        if self.window is not None:
            lo = jnp.maximum(0, (first - self.window + 1) // self.K)
            if not self.causal:
                hi = jnp.clip((last + self.window - 1) // self.K + 1, 0, self.Sp // self.K)
        return lo, jnp.maximum(hi, lo)

    def query_blocks(self, j):
        """[lo, hi) of the query blocks that see key block j (the transpose of key_blocks)."""
        off, first, last = self.S - self.T, j * self.K, (j + 1) * self.K - 1
        lo, hi = 0, self.Tp // self.Q
        if self.causal:
            lo = jnp.clip((first - off) // self.Q, 0, hi)
        if self.window is not None:
            hi = jnp.clip((last + self.window - 1 - off) // self.Q + 1, 0, self.Tp // self.Q)
            if not self.causal:
                lo = jnp.clip((first - self.window + 1 - off) // self.Q, 0, hi)
        return lo, jnp.maximum(hi, lo)

    def block_mask(self, valid_K, i, j):
        """(Q,K) admissible keys of tile (i, j): in range, valid, causal and window."""
        q_loc = i * self.Q + lax.broadcasted_iota(jnp.int32, (self.Q, self.K), 0)
        k_loc = j * self.K + lax.broadcasted_iota(jnp.int32, (self.Q, self.K), 1)
        d = q_loc + (self.S - self.T) - k_loc  # query position − key position
        m = (k_loc < self.S) & (valid_K[None, :] > 0)
        if self.causal:
            m = m & (d >= 0)
        if self.window is not None:
            m = m & (d < self.window) if self.causal else m & (jnp.abs(d) < self.window)
        return m


def _matmul(a, b, contract_a: int, contract_b: int):
    """a·b contracting one axis of each (a tile product), accumulated in float32."""
    dims = (((contract_a,), (contract_b,)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _tile_terms(geo: _Geometry, beta, q, k, offset_Q, valid_K, i, j):
    """(z, x, admissible mask) of tile (i, j): z = q·kᵀ, x = β·z + c."""
    z = _matmul(q, k, 1, 1)
    return z, beta * z + offset_Q[:, None], geo.block_mask(valid_K, i, j)


def _gate(gate: str, x):
    return jax.nn.sigmoid(x) if gate == "sigmoid" else jnp.maximum(x, 0.0)


def _gate_grad(gate: str, x):
    """g'(x): σ(1 − σ) for sigmoid; 1 where x > 0 for ReLU (jax.nn.relu's derivative, 0 at 0)."""
    if gate == "sigmoid":
        s = jax.nn.sigmoid(x)
        return s * (1.0 - s)
    return (x > 0).astype(x.dtype)


def _forward_kernel(geo, gate, beta_ref, q_ref, k_ref, v_ref, c_ref, r_ref, valid_ref, o_ref):
    i, K = pl.program_id(2), geo.K
    q, beta, c = q_ref[...], beta_ref[...][:, None], c_ref[...]

    def body(j, acc):
        k, v = k_ref[pl.ds(j * K, K), :], v_ref[pl.ds(j * K, K), :]
        _, x, m = _tile_terms(geo, beta, q, k, c, valid_ref[pl.ds(j * K, K)], i, j)
        w = jnp.where(m, _gate(gate, x), 0.0)
        return acc + _matmul(w.astype(v.dtype), v, 1, 0)

    lo, hi = geo.key_blocks(i)
    acc = lax.fori_loop(lo, hi, body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = (acc * r_ref[...][:, None]).astype(o_ref.dtype)


def _dkdv_kernel(geo, gate, beta_ref, q_ref, k_ref, v_ref, c_ref, r_ref, valid_ref, do_ref, dk_ref, dv_ref):
    j, Q = pl.program_id(2), geo.Q
    k, v, valid = k_ref[...], v_ref[...], valid_ref[...]

    def body(i, carry):
        dk, dv = carry
        q, do = q_ref[pl.ds(i * Q, Q), :], do_ref[pl.ds(i * Q, Q), :]
        beta, c, r = beta_ref[pl.ds(i * Q, Q)][:, None], c_ref[pl.ds(i * Q, Q)], r_ref[pl.ds(i * Q, Q)][:, None]
        _, x, m = _tile_terms(geo, beta, q, k, c, valid, i, j)
        w = jnp.where(m, _gate(gate, x), 0.0) * r
        dw = _matmul(do, v, 1, 1)
        dx = jnp.where(m, _gate_grad(gate, x), 0.0) * r * dw
        dv = dv + _matmul(w.astype(do.dtype), do, 0, 0)
        dk = dk + _matmul((dx * beta).astype(q.dtype), q, 0, 0)
        return dk, dv

    lo, hi = geo.query_blocks(j)
    zeros = jnp.zeros(k_ref.shape, jnp.float32)
    dk, dv = lax.fori_loop(lo, hi, body, (zeros, zeros))
    dk_ref[...], dv_ref[...] = dk.astype(dk_ref.dtype), dv.astype(dv_ref.dtype)


def _dq_kernel(geo, gate, beta_ref, q_ref, k_ref, v_ref, c_ref, r_ref, valid_ref, do_ref, dq_ref, dbeta_ref):
    i, K = pl.program_id(2), geo.K
    q, do, beta, c, r = q_ref[...], do_ref[...], beta_ref[...][:, None], c_ref[...], r_ref[...][:, None]

    def body(j, carry):
        dq, dbeta = carry
        k, v = k_ref[pl.ds(j * K, K), :], v_ref[pl.ds(j * K, K), :]
        z, x, m = _tile_terms(geo, beta, q, k, c, valid_ref[pl.ds(j * K, K)], i, j)
        dx = jnp.where(m, _gate_grad(gate, x), 0.0) * r * _matmul(do, v, 1, 1)
        return dq + _matmul((dx * beta).astype(k.dtype), k, 1, 0), dbeta + jnp.sum(dx * z, axis=1)

    lo, hi = geo.key_blocks(i)
    init = (jnp.zeros(q_ref.shape, jnp.float32), jnp.zeros(dbeta_ref.shape, jnp.float32))
    dq, dbeta = lax.fori_loop(lo, hi, body, init)
    dq_ref[...], dbeta_ref[...] = dq.astype(dq_ref.dtype), dbeta


def _specs(geo: _Geometry, H: int, by_keys: bool):
    """BlockSpecs of (β rows, q, k, v, c, r, valid, dO) for a grid (B, N, blocks): the gridded side's tile,
    the other side whole (its blocks are walked by the kernel's loop)."""
    Q, K, Tp, Sp = geo.Q, geo.K, geo.Tp, geo.Sp
    whole_q = lambda b, n, g: (b, n, 0, 0)  # noqa: E731
    tile = lambda b, n, g: (b, n, g, 0)  # noqa: E731
    if by_keys:
        q_spec = pl.BlockSpec((None, None, Tp, H), whole_q)
        kv_spec = pl.BlockSpec((None, None, K, H), tile)
        rows = pl.BlockSpec((None, Tp), lambda b, n, g: (b, 0))
        beta = pl.BlockSpec((None, Tp), lambda b, n, g: (n, 0))
        valid = pl.BlockSpec((None, K), lambda b, n, g: (b, g))
    else:
        q_spec = pl.BlockSpec((None, None, Q, H), tile)
        kv_spec = pl.BlockSpec((None, None, Sp, H), whole_q)
        rows = pl.BlockSpec((None, Q), lambda b, n, g: (b, g))
        beta = pl.BlockSpec((None, Q), lambda b, n, g: (n, g))
        valid = pl.BlockSpec((None, Sp), lambda b, n, g: (b, 0))
    return [beta, q_spec, kv_spec, kv_spec, rows, rows, valid, q_spec]


def _make_attention(geo: _Geometry, gate: str, interpret: bool):
    """The custom-VJP function (β_N, q, k, v, c_BT, r_BT, valid_BS) -> out on padded operands."""

    def call(kernel, out_shape, grid, in_specs, out_specs, *operands):
        return pl.pallas_call(
            functools.partial(kernel, geo, gate),
            out_shape=out_shape,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            interpret=interpret,
            # Triton, named: a pallas_call without compiler parameters goes to Mosaic GPU in jax 0.10+,
            # which stages each block in shared memory, and the whole-sequence k/v blocks do not fit.
            compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2),
        )(*operands)

    def beta_rows(beta_N):
        return jnp.broadcast_to(beta_N[:, None], (beta_N.shape[0], geo.Tp))

    def forward(beta_N, q, k, v, c, r, valid):
        B, N, _, H = q.shape
        specs = _specs(geo, H, by_keys=False)
        out_shape = jax.ShapeDtypeStruct(q.shape[:3] + (v.shape[3],), v.dtype)
        grid = (B, N, geo.Tp // geo.Q)
        return call(_forward_kernel, out_shape, grid, specs[:7], specs[1], beta_rows(beta_N), q, k, v, c, r, valid)

    @jax.custom_vjp
    def fn(beta_N, q, k, v, c, r, valid):
        return forward(beta_N, q, k, v, c, r, valid)

    def fn_fwd(*operands):
        return forward(*operands), operands

    def fn_bwd(operands, do):
        beta_N, q, k, v, c, r, valid = operands
        B, N, _, H = q.shape
        args = (beta_rows(beta_N), q, k, v, c, r, valid, do.astype(q.dtype))
        by_keys = _specs(geo, H, by_keys=True)
        dk, dv = call(
            _dkdv_kernel,
            (jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
            (B, N, geo.Sp // geo.K),
            by_keys,
            (by_keys[2], by_keys[3]),
            *args,
        )
        by_queries = _specs(geo, H, by_keys=False)
        row_spec = pl.BlockSpec((None, None, geo.Q), lambda b, n, g: (b, n, g))
        dq, dbeta_BNT = call(
            _dq_kernel,
            (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q.shape[:3], jnp.float32)),
            (B, N, geo.Tp // geo.Q),
            by_queries,
            (by_queries[1], row_spec),
            *args,
        )
        zeros = jnp.zeros_like
        return dbeta_BNT.sum((0, 2)), dq, dk, dv, zeros(c), zeros(r), zeros(valid)

    fn.defvjp(fn_fwd, fn_bwd)
    return fn
