"""Softpick (Zuhri et al. 2025, "Softpick: No Attention Sink, No Massive Activations with Rectified Softmax",
arXiv 2504.20966): a rectified softmax whose rows need not sum to one.

    softpick(x)_i = ReLU(e^{x_i} − 1) / (Σ_j |e^{x_j} − 1| + ε)                      (the paper's Eq. 2)

over the admissible keys j of the row, x = βz the scaled scores. A key with x ≤ 0 gets exactly 0, yet still
counts in the denominator, so a row can hand out less than its unit of mass (no sink needed to park it).
Computed as the paper's Eq. 3 and its code (zaydzuhri/softpick-attention, naive_softpick_attn.py) do, numerator
and denominator divided by e^m: ReLU(e^{x_i − m} − e^{−m}) / (Σ_j |e^{x_j − m} − e^{−m}| + ε), with
m = max(max_j x_j, 0) (their m is max_j x_j; the floor at 0 keeps e^{−m} ≤ 1, so a row of very negative scores
cannot overflow, and leaves Eq. 2 exact, ε included, wherever max x ≤ 0). ε is therefore ε·e^m in Eq. 2's
units, as in their code; m is held constant in the gradient (as FlashAttention's running max), which leaves out
only the ε·e^m term's own derivative.
"""

from __future__ import annotations

import math
import types

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.backends.blockwise import BlockForm, scaled_logits
from attnlab.options import normalizers as normalizer_options

from .base import ScoreNormalizer
from .exponential import row_mean_N


class Softpick(ScoreNormalizer):
    """ReLU(e^x − 1)/(Σ|e^x − 1| + ε) of x = βz over the admissible keys (Zuhri et al. 2025, Eq. 2)."""

    # the soft cap, which its reference applies itself, and ε at 0
    check_variants = types.MappingProxyType(
        {"default": {}, "beta2-softcap1.5": {"beta": 2.0, "softcap": 1.5}, "eps0": {"eps": 0.0}}
    )

    def __init__(self, *, eps=1e-8, **shared):
        normalizer_options.softpick(eps=eps)
        self.eps = float(eps)
        super().__init__(**shared)

    def block_form(self):
        return self.capped(BlockForm("softpick", {"beta": self.beta()}, scaled_logits, eps=self.eps))

    def normalize(self, z_BNTS, m_B1TS):
        beta_N = self.beta()
        x_BNTS = beta_N[None, :, None, None] * z_BNTS
        m_BNT1 = jax.lax.stop_gradient(jnp.maximum(jnp.where(m_B1TS, x_BNTS, -jnp.inf).max(-1, keepdims=True), 0.0))
        u_BNTS = jnp.where(m_B1TS, jnp.exp(jnp.where(m_B1TS, x_BNTS - m_BNT1, -jnp.inf)) - jnp.exp(-m_BNT1), 0.0)
        den_BNT1 = jnp.abs(u_BNTS).sum(-1, keepdims=True) + self.eps
        # A row with no admissible key, or (at ε = 0) whose keys all score exactly 0, weighs nothing.
        att_BNTS = jax.nn.relu(u_BNTS) / jnp.where(den_BNT1 > 0, den_BNT1, 1.0)
        return att_BNTS, x_BNTS, {"beta": beta_N, "zero_share": self._zero_share(att_BNTS, m_B1TS)}

    @staticmethod
    def _zero_share(att_BNTS, m_B1TS):
        """Per head, the mean over rows of the share of admissible keys weighted exactly 0 (softpick's sparsity)."""
        n_B1T = m_B1TS.sum(-1)
        zeros_BNT = jnp.sum(m_B1TS & (att_BNTS == 0), -1)
        return row_mean_N(zeros_BNT / jnp.maximum(n_B1T, 1), m_B1TS)

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64 numpy (weights_BNTS, logits_BNTS, extras) of Eq. 2, row by row, the soft cap on βz where set:
        ReLU(expm1(x)) / (Σ|expm1(x)| + ε·e^{max(max x, 0)})."""
        beta_N = np.asarray(self.beta(), np.float64)
        q, k = np.asarray(q_BNTH, np.float64), np.asarray(k_BNSH, np.float64)
        x = beta_N[None, :, None, None] * np.einsum("bnth,bnsh->bnts", q, k)
        if self.softcap is not None:
            x = self.softcap * np.tanh(x / self.softcap)
        B, N, T, _ = x.shape
        w = np.zeros_like(x)
        zero_share, has = np.zeros((B, N, T)), np.zeros((B, N, T), bool)
        for b, n, t in np.ndindex(B, N, T):
            idx = np.flatnonzero(admissible_BTS[b, t])
            if idx.size:
                r = x[b, n, t, idx]
                u = np.expm1(r)
                den = np.abs(u).sum() + self.eps * math.exp(max(r.max(), 0.0))
                w[b, n, t, idx] = np.maximum(u, 0.0) / den if den > 0 else 0.0
                zero_share[b, n, t], has[b, n, t] = np.mean(w[b, n, t, idx] == 0), True
        share_N = np.where(has, zero_share, 0.0).sum((0, 2)) / np.maximum(has.sum((0, 2)), 1)
        return w, x, {"beta": beta_N, "zero_share": share_N}
