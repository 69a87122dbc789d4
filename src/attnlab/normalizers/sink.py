"""Attention with a learnable sink logit per head (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", §2.1;
openai/gpt-oss, gpt_oss/torch/model.py `sdpa`: the per-head `sinks` concatenated to the scores as one more
softmax column, dropped after the softmax).

    w_ij = e^{x_ij} / (e^{b_h} + Σ_k e^{x_ik}),   x = βz

over the admissible keys k of the row: the sink is a key with logit b_h and value 0, so a row may hand its mass
to nothing. b_h = 0 is softmax₁ ("attention is off by one"); b_h → −∞ is softmax.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.backends.blockwise import BlockForm, scaled_logits
from attnlab.backends.mask import masked_max
from attnlab.options import normalizers as normalizer_options

from .base import FixedFeatures, NormalizerParam, ScoreNormalizer


class Sink(ScoreNormalizer):
    """e^{x_i}/(e^{b_h} + Σ_j e^{x_j}) of x = βz, a sink logit b_h per head, learnable unless `learnable_sink`
    is false (gpt-oss 2025)."""

    # a fixed sink logit, and a larger one under the soft cap, which its reference applies itself
    check_variants = types.MappingProxyType(
        {
            "default": {},
            "fixed-1.5": {"sink": -1.5, "learnable_sink": False},
            "sink2-softcap2": {"sink": 2.0, "softcap": 2.0},
        }
    )

    def __init__(self, *, num_heads, sink=0.0, learnable_sink=True, **shared):
        normalizer_options.sink(sink=sink, learnable_sink=learnable_sink)
        b_N = jnp.full((num_heads,), float(sink), jnp.float32)
        self.sink = NormalizerParam(b_N) if learnable_sink else FixedFeatures(b_N)
        super().__init__(num_heads=num_heads, **shared)

    def block_form(self):
        return self.capped(BlockForm("exp", {"beta": self.beta(), "sink": self.sink[...]}, scaled_logits, sink="sink"))

    def normalize(self, z_BNTS, m_B1TS):
        beta_N, b_N = self.beta(), self.sink[...]
        logits_BNTS = beta_N[None, :, None, None] * z_BNTS
        b_1N11 = b_N[None, :, None, None]
        # Stable form as softmax₁'s (exponential.py) with the sink's logit in place of 0:
        # m = max(max x, b), a shift that cancels (no gradient); e^{x − m}/(e^{b − m} + Σ e^{x − m}).
        mx = jnp.maximum(masked_max(logits_BNTS, m_B1TS), jax.lax.stop_gradient(b_1N11))
        e = jnp.exp(jnp.where(m_B1TS, logits_BNTS - mx, -jnp.inf))
        att_BNTS = e / (jnp.exp(b_1N11 - mx) + e.sum(-1, keepdims=True))
        return att_BNTS, logits_BNTS, {"beta": beta_N, "sink_logit": b_N}

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64 numpy (weights_BNTS, logits_BNTS, extras): e^{x_i − L} with L = log(e^b + Σ_j e^{x_j}) over the
        admissible keys of each row, the soft cap on βz where set."""
        beta_N = np.asarray(self.beta(), np.float64)
        b_N = np.asarray(self.sink[...], np.float64)
        x = beta_N[None, :, None, None] * np.einsum(
            "bnth,bnsh->bnts", np.asarray(q_BNTH, np.float64), np.asarray(k_BNSH, np.float64)
        )
        if self.softcap is not None:
            x = self.softcap * np.tanh(x / self.softcap)
        w = np.zeros_like(x)
        for b, n, t in np.ndindex(x.shape[:3]):
            idx = np.flatnonzero(admissible_BTS[b, t])
            if idx.size:
                r = x[b, n, t, idx]
                w[b, n, t, idx] = np.exp(r - np.logaddexp(b_N[n], np.logaddexp.reduce(r)))
        return w, x, {"beta": beta_N, "sink_logit": b_N.copy()}
