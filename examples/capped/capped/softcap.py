"""Softmax of soft-capped logits, c·tanh(βz/c), as Gemma 2 caps its attention logits (Gemma Team 2024, Sec. 2)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from attnlab.checks import real
from attnlab.normalizers import InverseTemperature, ScoreNormalizer, masked_softmax


class CappedSoftmax(ScoreNormalizer):
    """softmax(c·tanh(βz/c)) over the admissible keys: |logit| < c, softmax itself as c → ∞."""

    def __init__(self, *, num_heads, head_dim, rngs, cap=5.0, beta=None, learnable=True, per_head=True, impl="auto"):
        self.cap = real("normalizer.cap", cap, 0.0, lo_open=True)
        self.beta = InverseTemperature(num_heads, head_dim, beta, learnable, per_head)
        self.set_impl(impl, None, head_dim)

    def normalize(self, z_BNTS, m_B1TS):
        beta_N = self.beta()
        logits_BNTS = self.cap * jnp.tanh(beta_N[None, :, None, None] * z_BNTS / self.cap)
        return masked_softmax(logits_BNTS, m_B1TS), logits_BNTS, {"beta": beta_N}

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """The float64 form, row by row over the admissible keys (attnlab-check compares the two)."""
        beta_N = np.asarray(self.beta(), np.float64)
        z_BNTS = np.einsum("bnth,bnsh->bnts", np.asarray(q_BNTH, np.float64), np.asarray(k_BNSH, np.float64))
        logits_BNTS = self.cap * np.tanh(beta_N[None, :, None, None] * z_BNTS / self.cap)
        weights_BNTS = np.zeros_like(logits_BNTS)
        for b, n, t in np.ndindex(logits_BNTS.shape[:3]):
            keys = np.flatnonzero(admissible_BTS[b, t])
            if keys.size:  # a row with no admissible key stays 0
                e = np.exp(logits_BNTS[b, n, t, keys] - logits_BNTS[b, n, t, keys].max())
                weights_BNTS[b, n, t, keys] = e / e.sum()
        return weights_BNTS, logits_BNTS, {"beta": beta_N}
