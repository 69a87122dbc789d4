"""Stick-breaking attention (Tan et al. 2024, "Scaling Stick-Breaking Attention", arXiv 2410.17980).

A query breaks a unit stick from its most recent key back: key j takes the share σ(x_ij) of what
the more recent keys left, A_ij = σ(x_ij) ∏_{j<k<i} (1 − σ(x_ik)), x = βz. The order of the keys
carries position, so no positional encoding is needed; what no key takes, 1 − Σ_j A_ij, is left
over (logged as `leftover`). Computed in log space as flash-linear-attention's
naive_stickbreaking_attn (fla/ops/stickbreaking_attn/naive.py): log σ(x) − Σ_{k>j} softplus(x_ik).
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.backends.blockwise import BlockForm, _rows, scaled_logits
from attnlab.backends.mask import Mask
from attnlab.checks import ConfigError
from attnlab.options import normalizers as normalizer_options

from . import reference as ref
from .base import ScoreNormalizer
from .exponential import row_mean_N


class StickBreaking(ScoreNormalizer):
    """A_ij = σ(βz_ij)·∏ over the admissible keys k more recent than j of (1 − σ(βz_ik)); causal masks only.

    `attend_current` false (fla's default) leaves the query's own position out of its row, so the
    first causal row attends to nothing. The blockwise form (`impl`) scans key blocks from the most
    recent back carrying Σ log(1 − σ), with the backward below (`_make_blocks`).
    """

    causal_only = True  # config.assembly.assemble refuses it for bidirectional models, naming the task

    # the query's own position breaking the stick first
    check_variants = types.MappingProxyType(
        {"default": {}, "attend_current-beta1": {"attend_current": True, "beta": 1.0}}
    )

    def __init__(self, *, attend_current=False, **shared):
        normalizer_options.stickbreaking(attend_current=attend_current)
        self.attend_current = attend_current
        super().__init__(**shared)

    def block_form(self):
        return self.capped(
            BlockForm(
                "stickbreaking",
                {"beta": self.beta()},
                scaled_logits,
                make=lambda form, geo: _make_blocks(geo, self.attend_current),
            )
        )

    @staticmethod
    def require_causal(mask: Mask) -> None:
        """Refuse a bidirectional mask: without an order of keys before the query there is no stick to break."""
        if not mask.causal:
            raise ConfigError(
                "normalizer=stickbreaking needs causal attention (it splits a unit stick from the "
                "most recent key back) and this mask is bidirectional; allowed: a causal mask "
                "(per-token tasks with model.causal=null|true; attend(..., causal=True))"
            )

    def __call__(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask, *, with_stats=False, score_probe_BNTS=None):
        self.require_causal(mask)
        return super().__call__(q_BNTH, k_BNSH, v_BNSH, mask, with_stats=with_stats, score_probe_BNTS=score_probe_BNTS)

    def weights(self, q_BNTH, k_BNSH, mask: Mask):
        self.require_causal(mask)
        return super().weights(q_BNTH, k_BNSH, mask)

    def normalize_rows(self, z_BNRS, m_B1RS, q_pos_R):
        return self.normalize(z_BNRS, m_B1RS, q_pos_R)

    def normalize(self, z_BNTS, m_B1TS, q_pos_T=None):
        T, S = z_BNTS.shape[-2:]
        beta_N = self.beta()
        x_BNTS = beta_N[None, :, None, None] * z_BNTS
        m = m_B1TS
        if not self.attend_current:
            q_pos_T = jnp.arange(T) + (S - T) if q_pos_T is None else q_pos_T
            m = m & (jnp.arange(S)[None, :] != q_pos_T[:, None])[None, None]
        log_keep = jnp.where(m, -jax.nn.softplus(x_BNTS), 0.0)  # log(1 − σ(x)) on admissible keys
        # Σ_{k>j} log(1 − σ(x_k)): the reverse cumulative sum shifted by one key (no subtraction of a large term).
        rev = jnp.flip(jnp.cumsum(jnp.flip(log_keep, -1), -1), -1)
        after = jnp.concatenate([rev[..., 1:], jnp.zeros_like(rev[..., :1])], -1)
        log_att = jnp.where(m, jax.nn.log_sigmoid(x_BNTS) + after, -jnp.inf)
        att_BNTS = jnp.where(m, jnp.exp(log_att), 0.0)
        extras = {"beta": beta_N, "leftover": row_mean_N(1.0 - att_BNTS.sum(-1), m_B1TS)}
        return att_BNTS, x_BNTS, extras

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64: A_ij = σ(x_ij)·∏ over the admissible keys k more recent than j of (1 − σ(x_ik)), x = βz, as a plain
        product (the query's own position left out unless attend_current); `leftover` the row mean of 1 − Σ_j A_ij."""
        beta_N = ref.inverse_temperature(self, q_BNTH.shape[1])
        x_BNTS = beta_N[None, :, None, None] * ref.scores(q_BNTH, k_BNSH)
        T, S = x_BNTS.shape[-2:]

        def sig(r):
            return 1 / (1 + np.exp(-r))

        def row(r, b, n, t, idx):
            keep = np.flatnonzero(np.ones(idx.size, bool) if self.attend_current else idx != t + (S - T))
            w = np.zeros(idx.size)
            for a in keep:
                w[a] = sig(r[a]) * np.prod([1 - sig(r[c]) for c in keep if idx[c] > idx[a]])
            return w

        w = ref.rowwise(row, x_BNTS, admissible_BTS)
        return w, x_BNTS, {"beta": beta_N, "leftover": ref.row_mean(1 - w.sum(-1), admissible_BTS)}


def _make_blocks(geo, attend_current: bool):
    """The custom-VJP function (params, q, k, v, kv, dense, n) -> out of stick-breaking over query × key blocks.

    Forward: per query block, key blocks from the most recent back, carrying C = Σ log(1 − σ(x)) over the
    admissible keys already passed: log A = log σ(x) + (the block's later keys) + C. Backward, with
    g = dO·v and δ = dO·out = Σ_j g_j A_j: ∂L/∂x_j = g_j A_j (1 − σ_j) − σ_j Σ_{j'<j} g_j' A_j' (every older
    key's product holds 1 − σ_j), the older keys' sum being δ minus the suffix from key j on.
    """
    Q, K = geo.Q, geo.K

    def block(p, q_blk, k_blk, kv, dense, i, j, carry_BNQ):
        m, q_pos, k_pos = geo.block_mask(kv, dense, i, j)
        if not attend_current:
            m = m & (k_pos[None, :] != q_pos[:, None])[None, None]
        z = jnp.einsum("bnqh,bnkh->bnqk", q_blk, k_blk, preferred_element_type=jnp.float32)
        x = p["beta"][None, :, None, None] * z
        log_keep = jnp.where(m, -jax.nn.softplus(x), 0.0)
        rev = jnp.flip(jnp.cumsum(jnp.flip(log_keep, -1), -1), -1)
        after = jnp.concatenate([rev[..., 1:], jnp.zeros_like(rev[..., :1])], -1) + carry_BNQ[..., None]
        att = jnp.where(m, jnp.exp(jnp.where(m, jax.nn.log_sigmoid(x) + after, -jnp.inf)), 0.0)
        return att, x, z, m, log_keep.sum(-1)

    def forward(p, q, k, v, kv, dense):
        B, N, _, H = q.shape

        def qblock(i):
            q_blk = _rows(q, i, Q)
            lo, hi = geo.key_range(i)

            def body(t, carry):
                acc, c = carry
                j = hi - 1 - t
                att, _, _, _, keep = block(p, q_blk, _rows(k, j, K), kv, dense, i, j, c)
                acc = acc + jnp.einsum(
                    "bnqk,bnkh->bnqh", att.astype(v.dtype), _rows(v, j, K), preferred_element_type=jnp.float32
                )
                return acc, c + keep

            acc, _ = jax.lax.fori_loop(0, hi - lo, body, (jnp.zeros((B, N, Q, H)), jnp.zeros((B, N, Q))))
            return acc

        out_nBNQH = jax.lax.map(qblock, jnp.arange(geo.Tp // Q))
        return jnp.moveaxis(out_nBNQH, 0, 2).reshape(B, N, geo.Tp, H)

    @jax.custom_vjp
    def fn(p, q, k, v, kv, dense, n):
        return forward(p, q, k, v, kv, dense).astype(v.dtype)

    def fn_fwd(p, q, k, v, kv, dense, n):
        out = forward(p, q, k, v, kv, dense)
        return out.astype(v.dtype), (p, q, k, v, kv, dense, n, out)

    def fn_bwd(res, do):
        p, q, k, v, kv, dense, n, out = res
        do = do.astype(jnp.float32)
        delta = jnp.sum(do * out, -1)

        def qblock(i, carry):
            dbeta, dq, dk, dv = carry
            q_blk, do_blk, delta_blk = _rows(q, i, Q), _rows(do, i, Q), _rows(delta, i, Q)
            lo, hi = geo.key_range(i)

            def body(t, c):
                dbeta, dq_blk, dk, dv, keep_c, suffix_c = c
                j = hi - 1 - t
                k_blk, v_blk = _rows(k, j, K), _rows(v, j, K)
                att, x, z, m, keep = block(p, q_blk, k_blk, kv, dense, i, j, keep_c)
                ga = jnp.where(m, jnp.einsum("bnqh,bnkh->bnqk", do_blk, v_blk.astype(jnp.float32)) * att, 0.0)
                suffix = jnp.flip(jnp.cumsum(jnp.flip(ga, -1), -1), -1) + suffix_c[..., None]
                sig = jax.nn.sigmoid(x)
                dx = jnp.where(m, ga * (1 - sig) - sig * (delta_blk[..., None] - suffix), 0.0)
                dz = dx * p["beta"][None, :, None, None]
                dbeta = dbeta + jnp.sum(dx * z, (0, 2, 3))
                dq_blk = dq_blk + jnp.einsum("bnqk,bnkh->bnqh", dz, k_blk.astype(jnp.float32))
                dk_j = jnp.einsum("bnqk,bnqh->bnkh", dz, q_blk.astype(jnp.float32))
                dv_j = jnp.einsum("bnqk,bnqh->bnkh", att, do_blk)
                dk = jax.lax.dynamic_update_slice_in_dim(dk, _rows(dk, j, K) + dk_j, j * K, 2)
                dv = jax.lax.dynamic_update_slice_in_dim(dv, _rows(dv, j, K) + dv_j, j * K, 2)
                return dbeta, dq_blk, dk, dv, keep_c + keep, suffix_c + ga.sum(-1)

            zq = jnp.zeros(q_blk.shape, jnp.float32)
            zr = jnp.zeros(q_blk.shape[:-1], jnp.float32)
            dbeta, dq_blk, dk, dv, _, _ = jax.lax.fori_loop(0, hi - lo, body, (dbeta, zq, dk, dv, zr, zr))
            return dbeta, jax.lax.dynamic_update_slice_in_dim(dq, dq_blk, i * Q, 2), dk, dv

        zeros = lambda a: jnp.zeros(a.shape, jnp.float32)  # noqa: E731
        init = (zeros(p["beta"]), zeros(q), zeros(k), zeros(v))
        dbeta, dq, dk, dv = jax.lax.fori_loop(0, geo.Tp // Q, qblock, init)
        dense_ct = None if dense is None else jnp.zeros_like(dense)
        return (
            {"beta": dbeta},
            dq.astype(q.dtype),
            dk.astype(k.dtype),
            dv.astype(v.dtype),
            jnp.zeros_like(kv),
            dense_ct,
            jnp.zeros_like(n),
        )

    fn.defvjp(fn_fwd, fn_bwd)
    return fn
