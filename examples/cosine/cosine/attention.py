"""Cosine attention: softmax(τ·cos(q, k)) over the admissible keys, τ a learnable temperature per head (Swin
Transformer V2's scaled cosine attention, Liu et al. 2022, Sec. 3.2; its τ is clamped, as here).

It needs the norms of q and k, which the scores z = q·kᵀ alone do not give, so it subclasses the general
`Normalizer` (its `__call__` and `weights`) instead of `ScoreNormalizer` (`normalize(z, mask)`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.checks import boolean, real
from attnlab.normalizers import FixedFeatures, Normalizer, NormalizerParam, core_stats, masked_softmax


class CosineAttention(Normalizer):
    """softmax(τ·q̂·k̂ᵀ), q̂ = q/‖q‖, k̂ = k/‖k‖: every logit lies in [−τ, τ] whatever the norms of q and k.

    τ = min(exp θ, tau_max) per head (or shared), θ a NormalizerParam (never weight-decayed). The statistics are
    attnlab's CORE_STATS of the weights plus τ as `beta` (the inverse temperature). `score_probe_BNTS` is added to
    the cosines, so the trainer's score_grad is dL/d cos.
    """

    exposes_scores = True  # __call__ takes score_probe_BNTS

    def __init__(self, *, num_heads, head_dim, rngs, tau=10.0, tau_max=100.0, learnable=True, per_head=True, eps=1e-6):
        self.tau_max = real("normalizer.tau_max", tau_max, 0.0, 1e6, lo_open=True)
        tau = real("normalizer.tau", tau, 0.0, self.tau_max, lo_open=True)
        self.eps = real("normalizer.eps", eps, 0.0, 1.0, lo_open=True)
        theta = jnp.full((num_heads,) if boolean("normalizer.per_head", per_head) else (1,), math.log(tau))
        self.theta = NormalizerParam(theta) if boolean("normalizer.learnable", learnable) else FixedFeatures(theta)
        self.num_heads = num_heads

    @property
    def param_ranges(self):
        """Where `attnlab-check` puts θ at the extremes: τ near 0, and τ past its clamp."""
        return {"theta": (math.log(1e-3), math.log(self.tau_max) + 2.0)}

    def tau(self):
        """τ (N,), clamped to tau_max."""
        theta_N = jnp.broadcast_to(self.theta[...], (self.num_heads,))
        return jnp.exp(jnp.minimum(theta_N, math.log(self.tau_max)))

    def _unit(self, x):
        """x / sqrt(‖x‖² + eps) along the head dimension."""
        return x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + self.eps)

    def _logits(self, q_BNTH, k_BNSH, probe_BNTS=None):
        """τ·cos(q, k) in float32, (B,N,T,S)."""
        q_hat, k_hat = (self._unit(x.astype(jnp.float32)) for x in (q_BNTH, k_BNSH))
        cos_BNTS = jnp.einsum("bnth,bnsh->bnts", q_hat, k_hat)
        if probe_BNTS is not None:
            cos_BNTS = cos_BNTS + probe_BNTS
        return self.tau()[None, :, None, None] * cos_BNTS

    def weights(self, q_BNTH, k_BNSH, mask):
        m_B1TS = mask.matrix_B1TS(q_BNTH.shape[2], k_BNSH.shape[2])
        return masked_softmax(self._logits(q_BNTH, k_BNSH), m_B1TS)

    def __call__(self, q_BNTH, k_BNSH, v_BNSH, mask, *, with_stats=False, score_probe_BNTS=None):
        m_B1TS = mask.matrix_B1TS(q_BNTH.shape[2], k_BNSH.shape[2])
        logits_BNTS = self._logits(q_BNTH, k_BNSH, score_probe_BNTS)
        w_BNTS = masked_softmax(logits_BNTS, m_B1TS)
        out_BNTH = jnp.einsum("bnts,bnsh->bnth", w_BNTS.astype(v_BNSH.dtype), v_BNSH)
        if not with_stats:
            return out_BNTH, {}
        return out_BNTH, {**core_stats(w_BNTS, logits_BNTS, m_B1TS), "beta": self.tau()}

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """The float64 form, row by row over the admissible keys (attnlab-check compares the two)."""
        theta_N = np.broadcast_to(np.asarray(self.theta[...], np.float64), (self.num_heads,))
        tau_N = np.exp(np.minimum(theta_N, math.log(self.tau_max)))
        q_hat, k_hat = (x / np.sqrt(np.sum(x * x, -1, keepdims=True) + self.eps) for x in (q_BNTH, k_BNSH))
        logits_BNTS = tau_N[None, :, None, None] * np.einsum("bnth,bnsh->bnts", q_hat, k_hat)
        weights_BNTS = np.zeros_like(logits_BNTS)
        for b, n, t in np.ndindex(logits_BNTS.shape[:3]):
            keys = np.flatnonzero(admissible_BTS[b, t])
            if keys.size:  # a row with no admissible key stays 0
                e = np.exp(logits_BNTS[b, n, t, keys] - logits_BNTS[b, n, t, keys].max())
                weights_BNTS[b, n, t, keys] = e / e.sum()
        return weights_BNTS, logits_BNTS, {"beta": tau_N}
