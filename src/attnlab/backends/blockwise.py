"""Blockwise attention in O(T·block) memory for normalizers whose weights are w_ts = g(x_ts)/D_t.

x = logits(params, z) is elementwise in the scores z = q·kᵀ (β, a prior, a bias); the forward pass
scans key blocks per query block carrying Σg·v, the denominator and, for exp, the running max
(Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"; Rabe & Staats 2021,
"Self-attention does not need O(n²) memory"; Dao et al. 2022, FlashAttention). A custom VJP
recomputes each block in the backward pass (FlashAttention, Alg. 4), so no T×S array is stored.

Operands are heads-major: q_BNTH, k_BNSH, v_BNSH (v's last dimension may differ from q's and k's). Kinds of `BlockForm`:
  exp:   g = exp(x − m), D = Σ exp(x − m) (+ exp(b − m) with a sink logit b: 0 for `sink=True`, softmax₁; the
         per-head parameter `params[sink]` for a named sink), m the running max;
  softpick: g = relu(exp(x − m) − exp(−m)), D = Σ |exp(x − m) − exp(−m)| + eps, m the running max of x and 0
         (softpick.py);
  sum:   D = Σ g + eps (rows with no admissible key: all zero, even at eps = 0);
  count: D = n (admissible keys of the row) with `divide_by_count`, else D = 1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp

from .mask import Mask


@dataclasses.dataclass(frozen=True)
class BlockForm:
    """A normalizer's elementwise piece: x = logits(params, z_BNQK, q_pos_Q, k_pos_K, n_B1Q1), w = g(x)/D."""

    kind: str
    params: dict
    logits: Callable
    gate: Callable | None = None
    eps: float = 0.0
    sink: bool | str = False  # True: a sink logit 0 (softmax₁); a params key: a per-head (N,) sink logit
    softcap: float | None = (
        None  # the soft cap `logits` applies (ScoreNormalizer.capped); kernels computing βz refuse it
    )
    divide_by_count: bool = False
    # Builds the custom-VJP block function itself, make(form, geometry), for a normalizer that is not
    # g(x)/D (stick-breaking: stickbreaking.py); None: the one below.
    make: Callable | None = None


def admissible_count_B1T(mask: Mask, T: int, S: int) -> jax.Array:
    """n_t, the admissible keys of each query row, without a T×S array unless a dense mask is given."""
    if mask.dense_BTS is not None:
        return mask.matrix_B1TS(T, S).sum(-1).astype(jnp.float32)
    kv_BS = jnp.ones((1, S)) if mask.key_valid_BS is None else mask.key_valid_BS.astype(jnp.float32)
    c_BS1 = jnp.pad(jnp.cumsum(kv_BS, -1), ((0, 0), (1, 0)))  # c[s] = valid keys among positions < s
    p_T = jnp.arange(T) + (S - T)
    hi_T = p_T + 1 if mask.causal else jnp.full((T,), S)
    hi_T = hi_T if mask.window is None or mask.causal else jnp.minimum(p_T + mask.window, S)
    lo_T = jnp.zeros((T,), int) if mask.window is None else jnp.maximum(p_T - mask.window + 1, 0)
    hi_T = jnp.clip(hi_T, 0, S)
    n_BT = c_BS1[:, hi_T] - c_BS1[:, jnp.minimum(lo_T, hi_T)]
    return n_BT[:, None, :]


def attention(form: BlockForm, q_BNTH, k_BNSH, v_BNSH, mask: Mask, block_size: int):
    """The attended output (B,N,T,H) of `form`, computed block by block (causal blocks skipped)."""
    B, N, T, H = q_BNTH.shape
    S = k_BNSH.shape[2]
    Q, K = min(block_size, T), min(block_size, S)
    Tp, Sp = -(-T // Q) * Q, -(-S // K) * K
    kv_BS = (
        jnp.ones((B, S), jnp.float32)
        if mask.key_valid_BS is None
        else jnp.broadcast_to(mask.key_valid_BS, (B, S)).astype(jnp.float32)
    )
    dense_BTS = None if mask.dense_BTS is None else jnp.broadcast_to(mask.dense_BTS, (B, T, S)).astype(jnp.float32)
    n_B1T = jnp.broadcast_to(admissible_count_B1T(mask, T, S), (B, 1, T))
    geo = _Geometry(T, S, Q, K, Tp, Sp, Mask(causal=mask.causal, window=mask.window))
    pad_t = ((0, 0), (0, 0), (0, Tp - T), (0, 0))
    pad_s = ((0, 0), (0, 0), (0, Sp - S), (0, 0))
    fn = (form.make or _make_attention)(form, geo)
    dense = None if dense_BTS is None else jnp.pad(dense_BTS, ((0, 0), (0, Tp - T), (0, Sp - S)))
    out_BNTH = fn(
        form.params,
        jnp.pad(q_BNTH, pad_t),
        jnp.pad(k_BNSH, pad_s),
        jnp.pad(v_BNSH, pad_s),
        jnp.pad(kv_BS, ((0, 0), (0, Sp - S))),
        dense,
        jnp.pad(n_B1T, ((0, 0), (0, 0), (0, Tp - T))),
    )
    return out_BNTH[:, :, :T]


@dataclasses.dataclass(frozen=True)
class _Geometry:
    T: int
    S: int
    Q: int
    K: int
    Tp: int
    Sp: int
    positional: Mask  # causal and window only

    def key_range(self, i):
        """[lo, hi) of the key blocks query block i can see (fewer under causal / window)."""
        nk = self.Sp // self.K
        first_pos, last_pos = i * self.Q + self.S - self.T, (i + 1) * self.Q - 1 + self.S - self.T
        hi = jnp.minimum(nk, last_pos // self.K + 1) if self.positional.causal else nk
        w = self.positional.window
        if w is not None and not self.positional.causal:
            hi = jnp.minimum(nk, (last_pos + w - 1) // self.K + 1)
        lo = 0 if w is None else jnp.maximum(0, (first_pos - w + 1) // self.K)
        return lo, jnp.maximum(hi, lo)

    def block_mask(self, kv_BS, dense, i, j):
        """(B,1,Q,K) admissible mask of block (i, j), with query/key positions."""
        q_loc, k_loc = i * self.Q + jnp.arange(self.Q), j * self.K + jnp.arange(self.K)
        q_pos, B = q_loc + (self.S - self.T), kv_BS.shape[0]
        m_QK = (q_loc < self.T)[:, None] & (k_loc < self.S)[None, :]
        pos_QK = self.positional.positional_TS(q_pos, k_loc)
        m_QK = m_QK if pos_QK is None else m_QK & pos_QK
        m_BQK = m_QK[None] & (jax.lax.dynamic_slice(kv_BS, (0, j * self.K), (B, self.K)) > 0)[:, None, :]
        if dense is not None:
            m_BQK = m_BQK & (jax.lax.dynamic_slice(dense, (0, i * self.Q, j * self.K), (B, self.Q, self.K)) > 0)
        return m_BQK[:, None], q_pos, k_loc


def _rows(x, i, size, axis=2):
    return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis)


def _make_attention(form: BlockForm, geo: _Geometry):
    """The custom-VJP function (params, q, k, v, kv, dense, n) -> out for one form and geometry."""

    @jax.custom_vjp
    def fn(p, q, k, v, kv, dense, n):
        return _forward(form, geo, p, q, k, v, kv, dense, n)[0].astype(v.dtype)

    def fn_fwd(p, q, k, v, kv, dense, n):
        out, r = _forward(form, geo, p, q, k, v, kv, dense, n)
        return out.astype(v.dtype), (p, q, k, v, kv, dense, n, out, r)

    fn.defvjp(fn_fwd, lambda res, do: _backward(form, geo, res, do))
    return fn


def _logits_block(form: BlockForm, geo: _Geometry, p, q_blk, k_blk, kv, dense, n_blk, i, j):
    """(x, admissible mask) of block (i, j): the form's logits of its scores."""
    m, q_pos, k_pos = geo.block_mask(kv, dense, i, j)
    z = jnp.einsum("bnqh,bnkh->bnqk", q_blk, k_blk, preferred_element_type=jnp.float32)
    return form.logits(p, z, q_pos, k_pos, n_blk[..., None]), m


def _sink_N(form: BlockForm, p, N: int):
    """The sink logit per head (N,): 0 for softmax₁, the named parameter otherwise."""
    return p[form.sink] if isinstance(form.sink, str) else jnp.zeros((N,), jnp.float32)


def _weights_block(form: BlockForm, x, m, r_BNQ):
    """w of a block given the row's stored denominator r (log D for exp and softpick, D otherwise)."""
    if form.kind == "exp":
        return jnp.exp(jnp.where(m, x - r_BNQ[..., None], -jnp.inf))
    if form.kind == "softpick":
        return jax.nn.relu(_softpick_terms(x, m, r_BNQ))
    return jnp.where(m, form.gate(x), 0.0) / r_BNQ[..., None]


def _softpick_terms(x, m, r_BNQ):
    """exp(x − r) − exp(−r) on admissible keys, 0 elsewhere: softpick's e^x − 1 over the row's scale e^r."""
    r = r_BNQ[..., None]
    return jnp.where(m, jnp.exp(jnp.where(m, x - r, -jnp.inf)) - jnp.exp(-r), 0.0)


def _accumulate(form: BlockForm, x, m, v_blk, carry):
    """One key block into a query block's (Σg·v, running max, Σg); exp and softpick rescale by the new running
    max (online softmax, Milakov & Gimelshein 2018)."""
    acc, m_run, l_run = carry
    if form.kind == "softpick":
        # Every term of e^x − 1 over e^m rescales by the same exp(m_old − m_new) as m grows.
        m_new = jnp.maximum(m_run, jnp.where(m, x, -jnp.inf).max(-1))
        scale = jnp.exp(m_run - m_new)
        u = _softpick_terms(x, m, m_new)
        acc = acc * scale[..., None] + jnp.einsum(
            "bnqk,bnkh->bnqh", jax.nn.relu(u).astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32
        )
        return acc, m_new, l_run * scale + jnp.abs(u).sum(-1)
    if form.kind == "exp":
        m_new = jnp.maximum(m_run, jnp.where(m, x, -jnp.inf).max(-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        scale = jnp.exp(m_run - m_safe)
        g = jnp.exp(jnp.where(m, x - m_safe[..., None], -jnp.inf))
        acc, l_run, m_run = acc * scale[..., None], l_run * scale, m_new
    else:
        g = jnp.where(m, form.gate(x), 0.0)
    acc = acc + jnp.einsum("bnqk,bnkh->bnqh", g.astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32)
    return acc, m_run, l_run + g.sum(-1)


def _finish_rows(form: BlockForm, p, acc, m_run, l_run, n_blk):
    """(out, r) of a query block: Σg·v over its denominator D, and r (log D for exp and softpick, D otherwise) for
    the backward."""
    if form.kind in ("exp", "softpick"):
        m_safe = jnp.where(jnp.isfinite(m_run), m_run, 0.0)
        if form.kind == "softpick":
            den = l_run + form.eps  # its running max starts at 0, so m is finite; a row with no key: D = eps
        elif form.sink:
            den = l_run + jnp.exp(_sink_N(form, p, m_run.shape[1])[None, :, None] - m_safe)
        else:
            den = l_run
        r = jnp.where(den > 0, m_safe + jnp.log(jnp.where(den > 0, den, 1.0)), jnp.inf)
    elif form.kind == "sum":
        den = r = jnp.where(n_blk > 0, l_run + form.eps, 1.0)
    else:
        den = r = jnp.broadcast_to(jnp.maximum(n_blk, 1.0) if form.divide_by_count else 1.0, l_run.shape)
    return acc / jnp.where(den > 0, den, 1.0)[..., None], r


def _forward(form: BlockForm, geo: _Geometry, p, q, k, v, kv, dense, n):
    """(out, r): each query block scans the key blocks it can see (lax.map over query blocks); v may be wider than
    q and k (differential attention's halves)."""
    B, N, _, H = v.shape
    Q, K = geo.Q, geo.K

    def qblock(i):
        q_blk, n_blk = _rows(q, i, Q), _rows(n, i, Q)

        def body(j, carry):
            x, m = _logits_block(form, geo, p, q_blk, _rows(k, j, K), kv, dense, n_blk, i, j)
            return _accumulate(form, x, m, _rows(v, j, K), carry)

        # softmax₁'s max is max(max x, 0) (exponential.py), a sink's max(max x, b), softpick's max(max x, 0)
        # (softpick.py): the running max starts at the sink logit, or 0.
        if form.sink:
            m0 = jnp.broadcast_to(_sink_N(form, p, N)[None, :, None], (B, N, Q)).astype(jnp.float32)
        else:
            m0 = jnp.full((B, N, Q), 0.0 if form.kind == "softpick" else -jnp.inf)
        lo, hi = geo.key_range(i)
        acc, m_run, l_run = jax.lax.fori_loop(lo, hi, body, (jnp.zeros((B, N, Q, H)), m0, jnp.zeros((B, N, Q))))
        return _finish_rows(form, p, acc, m_run, l_run, n_blk)

    out_nBNQH, r_nBNQ = jax.lax.map(qblock, jnp.arange(geo.Tp // Q))
    out = jnp.moveaxis(out_nBNQH, 0, 2).reshape(B, N, geo.Tp, H)
    return out, jnp.moveaxis(r_nBNQ, 0, 2).reshape(B, N, geo.Tp)


def _backward(form: BlockForm, geo: _Geometry, res, do):
    """The cotangents of (params, q, k, v, kv, dense, n): each block's weights recomputed from the stored r
    (FlashAttention, Alg. 4), so no T×S array is kept."""
    p, q, k, v, kv, dense, n, out, r = res
    Q, K = geo.Q, geo.K
    normalized = form.kind in ("exp", "sum", "softpick")
    do = do.astype(jnp.float32)
    # δ_t = Σ_s w_ts·dw_ts = dO_t·out_t (FlashAttention backward): the row-sum part of the Jacobian.
    delta = jnp.sum(do * out, -1) if normalized else jnp.zeros(out.shape[:-1])

    def qblock(i, carry):
        dp, dq, dk, dv = carry
        q_blk, n_blk, do_blk = _rows(q, i, Q), _rows(n, i, Q), _rows(do, i, Q)
        r_blk, delta_blk = _rows(r, i, Q), _rows(delta, i, Q)

        def body(j, c):
            dp, dq_blk, dk, dv = c
            v_blk = _rows(v, j, K)

            def w_of(p, q_blk, k_blk):
                x, m = _logits_block(form, geo, p, q_blk, k_blk, kv, dense, n_blk, i, j)
                return _weights_block(form, x, m, r_blk)

            def w_and_terms_of(p, q_blk, k_blk):
                x, m = _logits_block(form, geo, p, q_blk, k_blk, kv, dense, n_blk, i, j)
                u = _softpick_terms(x, m, r_blk)
                return jax.nn.relu(u), jnp.abs(u)

            dw = jnp.einsum("bnqh,bnkh->bnqk", do_blk, v_blk.astype(jnp.float32))
            if form.kind == "softpick":
                # w = relu(u)/D, D = Σ|u| + eps: ∂L/∂x = relu'(u)·e^{x−r}·dw − sign(u)·e^{x−r}·δ, the
                # denominator's part through |u| with cotangent −δ (δ = Σ w·dw as for softmax).
                (w, _), vjp = jax.vjp(w_and_terms_of, p, q_blk, _rows(k, j, K))
                dp_j, dq_j, dk_j = vjp((dw, jnp.broadcast_to(-delta_blk[..., None], dw.shape)))
            else:
                w, vjp = jax.vjp(w_of, p, q_blk, _rows(k, j, K))
                dp_j, dq_j, dk_j = vjp(dw - delta_blk[..., None] if normalized else dw)
            dv_j = jnp.einsum("bnqk,bnqh->bnkh", w, do_blk)
            dk = jax.lax.dynamic_update_slice_in_dim(dk, _rows(dk, j, K) + dk_j, j * K, 2)
            dv = jax.lax.dynamic_update_slice_in_dim(dv, _rows(dv, j, K) + dv_j, j * K, 2)
            return jax.tree.map(jnp.add, dp, dp_j), dq_blk + dq_j, dk, dv

        lo, hi = geo.key_range(i)
        zq = jnp.zeros(q_blk.shape, jnp.float32)
        dp, dq_blk, dk, dv = jax.lax.fori_loop(lo, hi, body, (dp, zq, dk, dv))
        return dp, jax.lax.dynamic_update_slice_in_dim(dq, dq_blk, i * Q, 2), dk, dv

    zeros = lambda a: jnp.zeros(a.shape, jnp.float32)  # noqa: E731
    init = (jax.tree.map(jnp.zeros_like, p), zeros(q), zeros(k), zeros(v))
    dp, dq, dk, dv = jax.lax.fori_loop(0, geo.Tp // Q, qblock, init)
    if isinstance(form.sink, str):
        # r = log(e^b + Σe^x): ∂L/∂b = Σ_t ∂L/∂r_t · e^{b − r_t} = −Σ_t δ_t · e^{b − r_t} (the sink's weight).
        b_N = p[form.sink]
        sink_w = jnp.exp(b_N[None, :, None] - r)
        dp = {**dp, form.sink: dp[form.sink] - jnp.sum(delta * sink_w, (0, 2))}
    dense_ct = None if dense is None else jnp.zeros_like(dense)
    return (
        dp,
        dq.astype(q.dtype),
        dk.astype(k.dtype),
        dv.astype(v.dtype),
        jnp.zeros_like(kv),
        dense_ct,
        jnp.zeros_like(n),
    )


def scaled_logits(p, z, q_pos, k_pos, n):
    """x = βz, β per head."""
    return p["beta"][None, :, None, None] * z


def power_gate(power: int, offset: bool) -> Callable:
    """|x|ᵖ, or the degree-p Taylor polynomial of exp (squared.py)."""
    if offset:
        return lambda x: sum(x**k / math.factorial(k) for k in range(power + 1))
    return lambda x: jnp.abs(x) ** power
