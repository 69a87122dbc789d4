"""Scalable-Softmax (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", arXiv 2501.19399).

softmax(s·log n·x) over the n admissible keys of a row, x = βz the scaled scores as for softmax: the
base of the exponential grows with n (n^{s·x}), so a row's largest weight need not fade as n grows
(softmax's does: a row of −2s with one +3 keeps 0.94 at n = 10, 0.13 at n = 1000).
"""

from __future__ import annotations

import math
import types

import jax.numpy as jnp
import numpy as np

from attnlab.backends.blockwise import BlockForm
from attnlab.backends.mask import masked_softmax
from attnlab.options import normalizers as normalizer_options

from . import reference as ref
from .base import FixedFeatures, NormalizerParam, ScoreNormalizer
from .exponential import row_mean_N


class SSMax(ScoreNormalizer):
    """softmax((s_h·log n + b_h)·βz) over admissible keys; s_h learnable per head, b_h (option `bias`) too.

    n is the admissible-key count of the row (causal rows: their position + 1, less padding). The
    paper's bias form (its Eq. with (s·log n + b)) adds b_h, initialised at 0. Statistics: `s` per head,
    and `beta` the row mean of the effective inverse temperature β(s log n + b), comparable to softmax's β.
    """

    # Not ScoreNormalizer's shared options: here β is a fixed scale and `learnable` is s's, so it declares its own.
    # the bias form, at another s and a fixed β
    check_variants = types.MappingProxyType({"default": {}, "s1.5-bias": {"s": 1.5, "bias": True, "beta": 0.6}})

    def __init__(
        self,
        *,
        num_heads,
        head_dim,
        rngs,
        s=0.43,
        learnable=True,
        bias=False,
        beta=None,
        impl="auto",
        block_size=512,
        softcap=None,
    ):
        normalizer_options.ssmax(s=s, learnable=learnable, beta=beta, bias=bias)
        self.scale = 1.0 / math.sqrt(head_dim) if beta is None else float(beta)
        self.has_bias = bias
        s_N = jnp.full((num_heads,), float(s), jnp.float32)
        self.s = NormalizerParam(s_N) if learnable else FixedFeatures(s_N)
        if self.has_bias:
            self.b = NormalizerParam(jnp.zeros((num_heads,), jnp.float32))
        self.set_softcap(softcap)
        self.set_impl(impl, block_size, head_dim)

    def score_scale(self):
        """The fixed β on z (the soft cap bounds βz, before the s·log n + b factor)."""
        return jnp.full(self.s[...].shape, self.scale, jnp.float32)

    def params(self) -> dict:
        """s_N and b_N (zeros without `bias`): what the blockwise form differentiates."""
        s_N = self.s[...]
        return {"s": s_N, "b": self.b[...] if self.has_bias else jnp.zeros_like(s_N)}

    def inverse_temperature(self, p, n_B1T1):
        """β(s log n + b), (B,N,T,1): the factor on z of each row."""
        log_n = jnp.log(jnp.maximum(n_B1T1, 1.0))
        return self.scale * (p["s"][None, :, None, None] * log_n + p["b"][None, :, None, None])

    def block_form(self):
        def logits(p, z, q_pos, k_pos, n):
            return self.inverse_temperature(p, n) * z

        return self.capped(BlockForm("exp", self.params(), logits))

    def softmax_rows(self, z_BNRS, m_B1RS, q_pos_R=None):
        p = self.params()
        beta_BNR1 = self.inverse_temperature(p, m_B1RS.sum(-1, keepdims=True).astype(jnp.float32))
        logits_BNRS = beta_BNR1 * z_BNRS
        extras = {"s": p["s"], "beta": row_mean_N(beta_BNR1[..., 0], m_B1RS)}
        if self.has_bias:
            extras["bias"] = p["b"]
        return logits_BNRS, logits_BNRS, extras

    def normalize(self, z_BNTS, m_B1TS):
        x_BNTS, logits_BNTS, extras = self.softmax_rows(z_BNTS, m_B1TS)
        return masked_softmax(x_BNTS, m_B1TS), logits_BNTS, extras

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64: softmax((s_h·log n + b_h)·βz) over the n admissible keys of each row; `beta` the row mean of the
        effective inverse temperature β(s_h log n + b_h)."""
        m = admissible_BTS
        N = q_BNTH.shape[1]
        s_N = np.asarray(self.s[...], np.float64)
        b_N = np.asarray(self.b[...], np.float64) if self.has_bias else np.zeros(N)
        log_n_BT = np.log(np.maximum(m.sum(-1), 1))
        eff_BNT = self.scale * (s_N[None, :, None] * log_n_BT[:, None, :] + b_N[None, :, None])
        x_BNTS = eff_BNT[..., None] * ref.scores(q_BNTH, k_BNSH)
        extras = {"s": s_N, "beta": ref.row_mean(eff_BNT, m)}
        if self.has_bias:
            extras["bias"] = b_N
        return ref.rowwise(lambda r, *_: ref.softmax_np(r), x_BNTS, m), x_BNTS, extras
