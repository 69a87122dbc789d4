"""Stick-breaking attention (Tan et al. 2024, "Scaling Stick-Breaking Attention", arXiv 2410.17980).

A query breaks a unit stick from its most recent key back: key j takes the share σ(x_ij) of what
the more recent keys left, A_ij = σ(x_ij) ∏_{j<k<i} (1 − σ(x_ik)), x = βz. The order of the keys
carries position, so no positional encoding is needed; what no key takes, 1 − Σ_j A_ij, is left
over (logged as `leftover`). Computed in log space as flash-linear-attention's
naive_stickbreaking_attn (fla/ops/stickbreaking_attn/naive.py): log σ(x) − Σ_{k>j} softplus(x_ik).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnlab import checks
from attnlab.checks import ConfigError

from .base import InverseTemperature, ScoreNormalizer
from .exponential import row_mean_N
from .mask import Mask


class StickBreaking(ScoreNormalizer):
    """A_ij = σ(βz_ij)·∏ over the admissible keys k more recent than j of (1 − σ(βz_ik)); causal masks only.

    `attend_current` false (fla's default) leaves the query's own position out of its row, so the
    first causal row attends to nothing. Dense only (a blockwise form would scan key blocks from the
    most recent back carrying Σ softplus, with its own backward; not implemented).
    """

    causal_only = True  # cli.build refuses it for bidirectional models, naming the task

    def __init__(self, *, num_heads, head_dim, rngs, beta=None, learnable=True, per_head=True, attend_current=False):
        self.beta = InverseTemperature(num_heads, head_dim, beta, learnable, per_head)
        self.attend_current = checks.boolean("normalizer.attend_current", attend_current)

    @staticmethod
    def require_causal(mask: Mask) -> None:
        """Refuse a bidirectional mask: without an order of keys before the query there is no stick to break."""
        if not mask.causal:
            raise ConfigError("normalizer=stickbreaking needs causal attention (it splits a unit stick from the "
                              "most recent key back) and this mask is bidirectional; allowed: a causal mask "
                              "(per-token tasks with model.causal=null|true; attend(..., causal=True))")

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
