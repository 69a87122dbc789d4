"""Normalizers built on exp(βz): softmax, KL-regularised, softmax₁ (sigmoid and ReLU gates are pointwise.py)."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.backends.blockwise import BlockForm, scaled_logits
from attnlab.backends.impl import Capability
from attnlab.backends.mask import masked_max, masked_softmax
from attnlab.backends.softmax_vjp import softmax_attention
from attnlab.options import normalizers as normalizer_options

from . import reference as ref
from .base import NormalizerParam, ScoreNormalizer


def row_mean_N(x_BNT, m_B1TS):
    """Mean over rows that have at least one admissible key, per head."""
    ok = jnp.broadcast_to(m_B1TS.any(-1), x_BNT.shape)
    return jnp.where(ok, x_BNT, 0.0).sum((0, 2)) / jnp.maximum(ok.sum((0, 2)), 1)


# Adaptive temperature (Veličković et al. 2024, "softmax is not enough (for sharp out-of-distribution)",
# arXiv 2410.01104, their reference code): β' = poly(H) of the row's Shannon entropy H (nats), a degree-4
# fit of the inverse temperature that restores sharpness (coefficients a4 … a0), applied only where
# H > 0.5 and never below 1 (it only sharpens); no stop-gradient, as in their code.
ADAPTIVE_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)
ADAPTIVE_MIN_ENTROPY = 0.5


def adaptive_inverse_temperature(logits_BNTS, m_B1TS):
    """β' (B,N,T,1) of each row from the entropy of softmax(logits) over its admissible keys."""
    p = masked_softmax(logits_BNTS, m_B1TS)
    h_BNT1 = -jnp.sum(p * jnp.log(p + 1e-9), -1, keepdims=True)  # the paper's +1e-9 inside the log
    poly = 0.0
    for a in ADAPTIVE_POLY:  # Horner
        poly = poly * h_BNT1 + a
    return jnp.where(h_BNT1 > ADAPTIVE_MIN_ENTROPY, jnp.maximum(poly, 1.0), 1.0)


class AdaptiveTemperature:
    """`adaptive_temperature`: off | eval (the paper: at inference only) | train (in training too).

    Mixed into a softmax-family normalizer that implements `softmax_logits(z, m)` (what its softmax
    acts on); where it applies, the weights are softmax(β'·x) with β' from `adaptive_inverse_temperature`,
    by the dense form (the entropy needs the whole row first), and `adaptive_beta` (the row mean of β')
    is logged. `weights` describes the normalizer at evaluation.
    """

    def set_adaptive(self, mode):
        normalizer_options.adaptive_temperature(adaptive_temperature=mode)
        self.adaptive = mode

    @property
    def mode_dependent(self) -> bool:
        return self.adaptive != "off"

    def adapts(self, training: bool) -> bool:
        return self.adaptive == "train" or (self.adaptive == "eval" and not training)

    def tempered(self, z_BNTS, m_B1TS):
        """(weights, logits, extras) with the adaptive temperature applied to every row."""
        _, _, extras = self.normalize(z_BNTS, m_B1TS)
        x_BNTS = self.softmax_logits(z_BNTS, m_B1TS)
        beta_BNT1 = adaptive_inverse_temperature(x_BNTS, m_B1TS)
        x_BNTS = beta_BNT1 * x_BNTS
        extras = {**extras, "adaptive_beta": row_mean_N(beta_BNT1[..., 0], m_B1TS)}
        return masked_softmax(x_BNTS, m_B1TS), x_BNTS, extras

    def __call__(self, q_BNTH, k_BNSH, v_BNSH, mask, *, with_stats=False, score_probe_BNTS=None, training=False):
        if not self.adapts(training):
            return super().__call__(
                q_BNTH, k_BNSH, v_BNSH, mask, with_stats=with_stats, score_probe_BNTS=score_probe_BNTS
            )
        return self._dense(q_BNTH, k_BNSH, v_BNSH, mask, with_stats, score_probe_BNTS, normalize=self.tempered)

    def weights(self, q_BNTH, k_BNSH, mask):
        if not self.adapts(False):
            return super().weights(q_BNTH, k_BNSH, mask)
        return self.tempered(self._scores(q_BNTH, k_BNSH), mask.matrix_B1TS(q_BNTH.shape[2], k_BNSH.shape[2]))[0]


class Softmax(AdaptiveTemperature, ScoreNormalizer):
    """softmax(β·q·kᵀ) over admissible keys; β = 1/√H by default is standard scaled attention.

    Plain steps run `impl` (backends/impl.py): cuDNN / XLA flash attention, blockwise, or the
    dense form with a hand-written backward (`softmax_attention`, faster on CPU).
    """

    # a fixed β shared by the heads; adaptive temperature, which evaluation applies
    check_variants = types.MappingProxyType(
        {
            "default": {},
            "beta0.7-shared": {"beta": 0.7, "per_head": False},
            "adaptive-eval": {"adaptive_temperature": "eval"},
        }
    )

    def __init__(self, *, adaptive_temperature="off", **shared):
        super().__init__(**shared)
        self.set_adaptive(adaptive_temperature)

    def softmax_logits(self, z_BNTS, m_B1TS):
        return self.beta()[None, :, None, None] * z_BNTS

    def capability(self):
        return Capability(fused=self.softcap is None, form=self.block_form())  # the fused kernels take no soft cap

    def block_form(self):
        return self.capped(BlockForm("exp", {"beta": self.beta()}, scaled_logits))

    def dense_call(self, q_BNTH, k_BNSH, v_BNSH, mask):
        if self.softcap is not None:  # the hand-written backward is softmax(βz)'s
            return super().dense_call(q_BNTH, k_BNSH, v_BNSH, mask)
        m_B1TS = mask.matrix_B1TS(q_BNTH.shape[2], k_BNSH.shape[2])
        return softmax_attention(q_BNTH, k_BNSH, v_BNSH, self.beta(), m_B1TS)

    def softmax_rows(self, z_BNRS, m_B1RS, q_pos_R=None):
        logits_BNRS = self.softmax_logits(z_BNRS, m_B1RS)
        return logits_BNRS, logits_BNRS, {"beta": self.beta()}

    def normalize(self, z_BNTS, m_B1TS):
        x_BNTS, logits_BNTS, extras = self.softmax_rows(z_BNTS, m_B1TS)
        return masked_softmax(x_BNTS, m_B1TS), logits_BNTS, extras

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64: softmax(βz) over the admissible keys, at the adaptive temperature where it applies at evaluation."""
        beta_N = ref.inverse_temperature(self, q_BNTH.shape[1])
        x_BNTS = beta_N[None, :, None, None] * ref.scores(q_BNTH, k_BNSH)
        return ref.tempered(x_BNTS, admissible_BTS, {"beta": beta_N}, self.adaptive)


class KL(AdaptiveTemperature, ScoreNormalizer):
    """π = argmax_π Σπz − (1/β)·KL(π‖u) = softmax(βz + log u) (the Gibbs variational principle).

    prior: `recency` (the default, so that kl is an ablation of softmax: log u ∝ −λ_h·|distance|,
    λ_h = exp(θ) learnable per head, initial `slope`), `uniform` (exactly masked softmax) or `learned`
    (a per-head table over relative distance, clipped at ±(max_distance − 1), initialised uniform).
    u is normalised over the admissible keys.
    """

    # each prior, and the recency prior under adaptive temperature
    check_variants = types.MappingProxyType(
        {
            "uniform": {"prior": "uniform"},
            "recency": {"prior": "recency", "slope": 0.3},
            "learned": {"prior": "learned", "max_distance": 4},
            "recency-adaptive": {"prior": "recency", "slope": 0.3, "adaptive_temperature": "eval"},
        }
    )

    def __init__(
        self, *, num_heads, prior="recency", slope=0.1, max_distance=512, adaptive_temperature="off", **shared
    ):
        normalizer_options.kl(prior=prior, slope=slope, max_distance=max_distance)
        self.prior, self.max_distance = prior, int(max_distance)
        if prior == "recency":
            self.log_slope = NormalizerParam(jnp.full((num_heads,), jnp.log(slope), jnp.float32))
        if prior == "learned":
            self.table = NormalizerParam(jnp.zeros((num_heads, 2 * self.max_distance - 1), jnp.float32))
        super().__init__(num_heads=num_heads, **shared)
        self.set_adaptive(adaptive_temperature)

    def capability(self):
        # A uniform prior is exactly softmax, so it may take the fused kernels too.
        return Capability(fused=self.prior == "uniform" and self.softcap is None, form=self.block_form())

    def prior_params(self):
        """The differentiable arrays of the prior ({} for uniform)."""
        if self.prior == "recency":
            return {"slope": jnp.exp(self.log_slope[...])}
        return {"table": self.table[...]} if self.prior == "learned" else {}

    def raw_prior(self, p, q_pos_T, k_pos_S):
        """Unnormalised log u, (N|1, T, S), from query/key positions."""
        d_TS = q_pos_T[:, None] - k_pos_S[None, :]
        if self.prior == "uniform":
            return jnp.zeros((1,) + d_TS.shape)
        if self.prior == "recency":
            return -p["slope"][:, None, None] * jnp.abs(d_TS)[None]
        M = self.max_distance
        return p["table"][:, jnp.clip(d_TS, -(M - 1), M - 1) + M - 1]

    def block_form(self):
        # log u's per-row normaliser is constant along the row and cancels inside the softmax
        # (dense: masked_softmax(βz + log u)), so blocks add the unnormalised prior only.
        def logits(p, z, q_pos, k_pos, n):
            return p["beta"][None, :, None, None] * z + self.raw_prior(p, q_pos, k_pos)[None]

        return self.capped(BlockForm("exp", {"beta": self.beta(), **self.prior_params()}, logits))

    def normalize_rows(self, z_BNRS, m_B1RS, q_pos_R):
        return self.normalize(z_BNRS, m_B1RS, q_pos_R)

    def softmax_logits(self, z_BNTS, m_B1TS, q_pos_T=None):
        """βz + log u on admissible keys (0 elsewhere): what π's softmax acts on."""
        bz_BNTS = self.beta()[None, :, None, None] * z_BNTS
        return jnp.where(m_B1TS, bz_BNTS + self.log_prior(m_B1TS, q_pos_T), 0.0)

    def log_prior(self, m_B1TS, q_pos_T=None):
        """log u over admissible keys (normalised per row), -inf elsewhere."""
        T, S = m_B1TS.shape[-2:]
        q_pos_T = jnp.arange(T) + (S - T) if q_pos_T is None else q_pos_T
        raw_NTS = self.raw_prior(self.prior_params(), q_pos_T, jnp.arange(S))
        raw = jnp.where(m_B1TS, raw_NTS[None], -jnp.inf)
        lse = jax.nn.logsumexp(raw, -1, keepdims=True)
        return jnp.where(m_B1TS, raw - jnp.where(jnp.isfinite(lse), lse, 0.0), -jnp.inf)

    def softmax_rows(self, z_BNTS, m_B1TS, q_pos_T=None):
        beta_N = self.beta()
        bz_BNTS = beta_N[None, :, None, None] * z_BNTS
        x_BNTS = self.softmax_logits(z_BNTS, m_B1TS, q_pos_T)
        # log π − log u = βz − LSE(βz + log u), so KL = β⟨π,z⟩ − LSE and the optimal value of the
        # objective is LSE/β (the Gibbs variational principle).
        lse_BNT = jax.nn.logsumexp(jnp.where(m_B1TS, x_BNTS, -jnp.inf), -1)
        lse_BNT = jnp.where(jnp.isfinite(lse_BNT), lse_BNT, 0.0)
        kl_BNT = jnp.sum(masked_softmax(x_BNTS, m_B1TS) * jnp.where(m_B1TS, bz_BNTS, 0.0), -1) - lse_BNT
        extras = {
            "beta": beta_N,
            "kl_prior": row_mean_N(kl_BNT, m_B1TS),
            "objective": row_mean_N(lse_BNT / beta_N[None, :, None], m_B1TS),
        }
        return x_BNTS, bz_BNTS, extras

    def normalize(self, z_BNTS, m_B1TS, q_pos_T=None):
        x_BNTS, bz_BNTS, extras = self.softmax_rows(z_BNTS, m_B1TS, q_pos_T)
        return masked_softmax(x_BNTS, m_B1TS), bz_BNTS, extras

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64: π = softmax(βz + log u) over the admissible keys, u the prior normalised over them; KL(π‖u) and
        the objective ⟨π, z⟩ − KL/β per row (the adaptive temperature, where it applies at evaluation, acting on π's
        logits βz + log u, the KL staying π's)."""
        m = admissible_BTS
        N = q_BNTH.shape[1]
        beta_N = ref.inverse_temperature(self, N)
        z = ref.scores(q_BNTH, k_BNSH)
        slope = np.exp(np.asarray(self.log_slope[...], np.float64)) if self.prior == "recency" else None
        table = np.asarray(self.table[...], np.float64) if self.prior == "learned" else None
        logu = kl_log_prior_np(m, N, self.prior, slope, table, self.max_distance)
        bz = beta_N[None, :, None, None] * z
        w = ref.rowwise(lambda r, b, n, t, idx: ref.softmax_np(r + logu[b, n, t, idx]), bz, m)
        B, _, T, _ = z.shape
        kl, obj = np.zeros((B, N, T)), np.zeros((B, N, T))
        for b, n, t in np.ndindex(B, N, T):
            idx = np.flatnonzero(m[b, t])
            if idx.size:
                p, lu = w[b, n, t, idx], logu[b, n, t, idx]
                kl[b, n, t] = np.sum(np.where(p > 0, p * (np.log(np.where(p > 0, p, 1)) - lu), 0))
                obj[b, n, t] = p @ z[b, n, t, idx] - kl[b, n, t] / beta_N[n]
        extras = {"beta": beta_N, "kl_prior": ref.row_mean(kl, m), "objective": ref.row_mean(obj, m)}
        if self.adaptive != "off":
            return ref.tempered(np.where(m[:, None], bz + logu, 0.0), m, extras, self.adaptive)
        return w, bz, extras


def kl_log_prior_np(m_BTS, N, prior, slope_N=None, table_NK=None, max_distance=512):
    """Float64 log u (B,N,T,S), normalised over the admissible keys of each row, −inf elsewhere. Query t sits at
    position i = t + S − T; recency: log u ∝ −λ_h|i − j|; learned: table[h, clip(i − j, ±(M − 1)) + M − 1]."""
    B, T, S = m_BTS.shape
    raw = np.zeros((B, N, T, S))
    for t, s, n in np.ndindex(T, S, N):
        d = t + (S - T) - s
        if prior == "recency":
            raw[:, n, t, s] = -np.broadcast_to(slope_N, (N,))[n] * abs(d)
        elif prior == "learned":
            M = max_distance
            raw[:, n, t, s] = table_NK[n, min(max(d, -(M - 1)), M - 1) + M - 1]
    logu = np.full_like(raw, -np.inf)
    for b, t in np.ndindex(B, T):
        idx = np.flatnonzero(m_BTS[b, t])
        if idx.size:
            r = raw[b, :, t, idx]  # (len(idx), N)
            lse = np.log(np.exp(r - r.max(0)).sum(0)) + r.max(0)
            logu[b, :, t, idx] = r - lse
    return logu


class Softmax1(ScoreNormalizer):
    """softmax₁: exp(βzᵢ)/(1 + Σⱼ exp(βzⱼ)), attention with a null sink ("attention is off by one")."""

    def block_form(self):
        return self.capped(BlockForm("exp", {"beta": self.beta()}, scaled_logits, sink=True))

    def normalize(self, z_BNTS, m_B1TS):
        beta_N = self.beta()
        logits_BNTS = beta_N[None, :, None, None] * z_BNTS
        # Stable form: m = max(max x, 0); exp(x − m)/(exp(−m) + Σ exp(x − m)). Subtracting the max
        # and then adding 1 (a widely copied version) changes the function.
        mx = jnp.maximum(masked_max(logits_BNTS, m_B1TS), 0.0)
        e = jnp.exp(jnp.where(m_B1TS, logits_BNTS - mx, -jnp.inf))
        return e / (jnp.exp(-mx) + e.sum(-1, keepdims=True)), logits_BNTS, {"beta": beta_N}

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64: exp(xᵢ)/(1 + Σⱼ exp(xⱼ)), x = βz over the admissible keys: exp(xᵢ − log(1 + Σ exp xⱼ))."""
        beta_N = ref.inverse_temperature(self, q_BNTH.shape[1])
        x_BNTS = beta_N[None, :, None, None] * ref.scores(q_BNTH, k_BNSH)
        w = ref.rowwise(lambda r, *_: np.exp(r - np.logaddexp(0.0, np.logaddexp.reduce(r))), x_BNTS, admissible_BTS)
        return w, x_BNTS, {"beta": beta_N}
