"""Pointwise normalizers: each key's weight is a function of its own score alone (and the row's key count), no
exponential shared across the row."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.backends.blockwise import BlockForm, scaled_logits
from attnlab.options import normalizers as normalizer_options

from . import reference as ref
from .base import ScoreNormalizer


class Sigmoid(ScoreNormalizer):
    """σ(βz + b) per key, b = −log n (n admissible keys of the row) unless `bias` is set (Apple, 2024)."""

    # a fixed bias in place of −log n
    check_variants = types.MappingProxyType({"default": {}, "bias-1.5": {"bias": -1.5}})

    def __init__(self, *, bias=None, **shared):
        normalizer_options.sigmoid(bias=bias)
        self.bias = None if bias is None else float(bias)
        super().__init__(**shared)

    def block_form(self):
        def logits(p, z, q_pos, k_pos, n):
            b = -jnp.log(jnp.maximum(n, 1)) if self.bias is None else self.bias
            return p["beta"][None, :, None, None] * z + b

        return self.capped(BlockForm("count", {"beta": self.beta()}, logits, gate=jax.nn.sigmoid))

    def normalize(self, z_BNTS, m_B1TS):
        beta_N = self.beta()
        n_B1T1 = m_B1TS.sum(-1, keepdims=True)
        b = -jnp.log(jnp.maximum(n_B1T1, 1)) if self.bias is None else self.bias
        logits_BNTS = beta_N[None, :, None, None] * z_BNTS + b
        return jnp.where(m_B1TS, jax.nn.sigmoid(logits_BNTS), 0.0), logits_BNTS, {"beta": beta_N}

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64: σ(βz + b) per admissible key, b = −log n (n admissible keys of the row) unless `bias` is set."""
        beta_N = ref.inverse_temperature(self, q_BNTH.shape[1])
        n_BT = np.maximum(admissible_BTS.sum(-1), 1)
        bias = -np.log(n_BT)[:, None, :, None] if self.bias is None else float(self.bias)
        x_BNTS = beta_N[None, :, None, None] * ref.scores(q_BNTH, k_BNSH) + bias
        return ref.rowwise(lambda r, *_: 1 / (1 + np.exp(-r)), x_BNTS, admissible_BTS), x_BNTS, {"beta": beta_N}


class ReLU(ScoreNormalizer):
    """relu(βz)/n, n = admissible keys of the row (Wortsman et al. 2023)."""

    def block_form(self):
        return self.capped(
            BlockForm("count", {"beta": self.beta()}, scaled_logits, gate=jax.nn.relu, divide_by_count=True)
        )

    def normalize(self, z_BNTS, m_B1TS):
        beta_N = self.beta()
        logits_BNTS = beta_N[None, :, None, None] * z_BNTS
        n_B1T1 = jnp.maximum(m_B1TS.sum(-1, keepdims=True), 1)
        return jnp.where(m_B1TS, jax.nn.relu(logits_BNTS), 0.0) / n_B1T1, logits_BNTS, {"beta": beta_N}

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64: relu(βz)/n over the n admissible keys of the row."""
        beta_N = ref.inverse_temperature(self, q_BNTH.shape[1])
        x_BNTS = beta_N[None, :, None, None] * ref.scores(q_BNTH, k_BNSH)
        return ref.rowwise(lambda r, *_: np.maximum(r, 0) / r.size, x_BNTS, admissible_BTS), x_BNTS, {"beta": beta_N}
