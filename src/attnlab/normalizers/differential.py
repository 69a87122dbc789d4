"""Differential attention (Ye et al. 2025, "Differential Transformer", ICLR 2025, arXiv 2410.05258, §2.1; their code:
microsoft/unilm, Diff-Transformer/multihead_diffattn.py).

Per head, q = [q₁, q₂] and k = [k₁, k₂] split into halves of h = ⌊H/2⌋ along the head dimension, v whole:

    w   = softmax(β q₁k₁ᵀ) − λ·softmax(β q₂k₂ᵀ)            over the admissible keys, β = 1/√h by default
    λ   = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init         λ_q1, λ_k1, λ_q2, λ_k2 ∈ ℝʰ, drawn N(0, 0.1²)
    λ_init = 0.8 − 0.6·exp(−0.3·l)                          l = 0, 1, … the layer (the paper's l − 1, 1-based)
    out = (1 − λ_init)·RMSNorm(w·v)                         per head over its H channels, a learnable scale g ∈ ℝᴴ

The two maps cancel the attention both give a key ("noise"), so a row's weights are signed and sum to 1 − λ.

How attnlab maps the paper. The paper's head has q₁, q₂, k₁, k₂ of d channels and v of 2d, and halves the number of
heads so the parameters match a Transformer's (h = d_model/2d); its code views the q and k projections as 2N heads of
d and v as N heads of 2d. Here a head of H = d_model/model.heads channels splits into the two halves of h = H/2 for
q and k (the paper's d) and keeps v whole (the paper's 2d): `normalizer=differential` at model.heads=N is the paper's
N heads, and the softmax Transformer it compares with is `normalizer=softmax model.heads=2N` (same parameters, heads
of h). What is kept equal: the two maps, λ's re-parameterisation and its initialisation (N(0, 0.1) vectors of h,
one λ per layer shared by its heads), λ_init's schedule by depth (the layer index comes from the model:
`takes_layer_index`), the per-head RMS norm (the code's `subln`, eps 1e-5, one scale of H channels shared by the
heads) and the factor 1 − λ_init. What differs: β is attnlab's inverse temperature (`_scored_.yaml`: learnable per
head by default; `learnable: false` is the paper's fixed 1/√d); an odd H leaves its last channel of q and k in
neither half (as attnlab's RoPE leaves it unrotated); RoPE rotates each half on its own (`qk_split`, as the code's
rotary on its 2N heads) with attnlab's rotate-half pairing, not the code's interleaved one; `lambda_init` may be
fixed and `learnable_lambda: false` keeps λ = λ_init. Used on its own (attend, the contract tests without a layer)
it is layer 0: λ_init = 0.2.

The weights are signed (`signed_weights`): the statistics of rows are those of the combined weights w (first_weight,
self_weight, max_weight, row_mass = 1 − λ), except the entropy, undefined for signed weights, which is the first
map's, softmax(β q₁k₁ᵀ) (the `entropy` extra replaces it); max_logit is the largest |β q_i k_iᵀ| of either map;
`diff_lambda` is λ. No single score matrix: score_grad is not logged (`exposes_scores` False). The output is not
w·v alone, so the float64 `reference_output` beside `reference` adds the RMS norm.

Blockwise form: w·v = o₁ − λ·o₂ with o_i = softmax(β q_i k_iᵀ)·v, each exactly softmax's blockwise attention over the
halves (two online-softmax scans sharing v; FlashAttention-based code does the same: multihead_flashdiff_1.py), then
the RMS norm; the dense form keeps two T×S maps per head, so the backend choice counts twice the heads.
"""

from __future__ import annotations

import dataclasses
import math
import types

import jax
import jax.numpy as jnp
import numpy as np

from attnlab import checks
from attnlab.backends import blockwise
from attnlab.backends.blockwise import BlockForm, scaled_logits
from attnlab.backends.mask import Mask, masked_softmax
from attnlab.options import normalizers as normalizer_options
from attnlab.statistics import BY_NAME, WeightRows

from . import reference as ref
from .base import FixedFeatures, NormalizerParam, ScoreNormalizer

RMS_EPS = 1e-5  # the code's subln: RMSNorm(2d, eps=1e-5)
LAMBDA_STD = 0.1  # λ_q1, λ_k1, λ_q2, λ_k2 ~ N(0, 0.1²)


def lambda_init_at(layer) -> float:
    """The paper's λ_init = 0.8 − 0.6·exp(−0.3·(l − 1)) of a 1-based layer l, for the 0-based index `layer`."""
    return 0.8 - 0.6 * jnp.exp(-0.3 * layer)


class Differential(ScoreNormalizer):
    """(softmax(βq₁k₁ᵀ) − λ softmax(βq₂k₂ᵀ))·v per head, then (1 − λ_init)·RMSNorm (Ye et al. 2025); signed
    weights; λ_init by the layer's depth unless `lambda_init` fixes it."""

    signed_weights = True
    takes_layer_index = True
    qk_split = 2
    exposes_scores = False  # two score maps: no one dL/dz

    # λ_init from the schedule (at layer 3 in the checker, 0 elsewhere) and fixed; the soft cap, which its
    # reference applies itself
    check_variants = types.MappingProxyType(
        {
            "default": {},
            "fixed0.5-beta1": {"lambda_init": 0.5, "learnable_lambda": False, "beta": 1.0},
            "softcap2": {"softcap": 2.0},
        }
    )

    def __init__(
        self,
        *,
        head_dim,
        rngs,
        lambda_init=None,
        learnable_lambda=True,
        **shared,
    ):
        checks.require(
            head_dim >= 2,
            f"normalizer=differential splits q and k per head in halves and the head dim is {head_dim}; "
            "allowed: a head dim (model.d_model / model.heads) of at least 2",
        )
        self.half = head_dim // 2
        normalizer_options.differential(lambda_init=lambda_init, learnable_lambda=learnable_lambda)
        self.fixed_lambda_init = None if lambda_init is None else float(lambda_init)  # None: the schedule by layer
        self.layer_index = FixedFeatures(jnp.zeros((), jnp.float32))  # state, so identical layers stay one scan
        # rows λ_q1, λ_k1, λ_q2, λ_k2 (multihead_diffattn.py: each normal_(mean=0, std=0.1))
        if learnable_lambda:
            draw = LAMBDA_STD * jax.random.normal(rngs.params(), (4, self.half), jnp.float32)
            self.lambda_qk = NormalizerParam(draw)
        else:
            self.lambda_qk = FixedFeatures(jnp.zeros((4, self.half), jnp.float32))
        self.head_scale = NormalizerParam(jnp.ones((head_dim,), jnp.float32))  # the RMS norm's scale g
        super().__init__(head_dim=head_dim, rngs=rngs, **shared)

    def score_dim(self, head_dim: int) -> int:
        return head_dim // 2  # each map's scores are dot products of the halves: β = 1/√h by default

    def set_layer_index(self, index: int) -> None:
        self.layer_index[...] = jnp.asarray(float(checks.integer("layer index", index, 0)), jnp.float32)

    def lambda_init(self):
        """λ_init: the fixed `lambda_init`, else the schedule at this layer."""
        if self.fixed_lambda_init is not None:
            return jnp.asarray(self.fixed_lambda_init, jnp.float32)
        return lambda_init_at(self.layer_index[...])

    def lam(self):
        """λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init, a scalar."""
        v = self.lambda_qk[...]
        return jnp.exp(jnp.dot(v[0], v[1])) - jnp.exp(jnp.dot(v[2], v[3])) + self.lambda_init()

    def choose_backend(self, T, S, mask, dtype, workload):
        # Two T×S maps per head: the dense form keeps twice the score tensors of a one-map normalizer.
        return super().choose_backend(T, S, mask, dtype, dataclasses.replace(workload, heads=2 * workload.heads))

    def _halves(self, x_BNTH):
        h = self.half
        return x_BNTH[..., :h], x_BNTH[..., h : 2 * h]

    def _scores(self, q_BNTH, k_BNSH):
        """The two maps' scores z_2BNTS = [q₁k₁ᵀ, q₂k₂ᵀ] (soft-capped as one map's), what `normalize` takes."""
        (q1, q2), (k1, k2) = self._halves(q_BNTH), self._halves(k_BNSH)
        return jnp.stack([super()._scores(q1, k1), super()._scores(q2, k2)])

    def normalize(self, z_2BNTS, m_B1TS):
        """(signed weights, logits, extras) of the two maps' scores; logits: per entry the larger in magnitude of the
        maps' βz (so max_logit is either map's largest); extras: β, λ and the first map's entropy."""
        beta_N = self.beta()
        x1_BNTS = beta_N[None, :, None, None] * z_2BNTS[0]
        x2_BNTS = beta_N[None, :, None, None] * z_2BNTS[1]
        p1_BNTS = masked_softmax(x1_BNTS, m_B1TS)
        lam = self.lam()
        att_BNTS = p1_BNTS - lam * masked_softmax(x2_BNTS, m_B1TS)
        logits_BNTS = jnp.where(jnp.abs(x1_BNTS) >= jnp.abs(x2_BNTS), x1_BNTS, x2_BNTS)
        entropy_N = BY_NAME["entropy"].per_head(WeightRows(p1_BNTS, x1_BNTS, m_B1TS))
        return att_BNTS, logits_BNTS, {"beta": beta_N, "diff_lambda": jnp.full_like(beta_N, lam), "entropy": entropy_N}

    def head_norm(self, o_BNTH):
        """(1 − λ_init)·g ⊙ o / √(mean_H o² + eps) per head and row (the code's subln), in float32."""
        o = o_BNTH.astype(jnp.float32)
        o = o * jax.lax.rsqrt(jnp.mean(o * o, -1, keepdims=True) + RMS_EPS)
        return ((1.0 - self.lambda_init()) * o * self.head_scale[...][None, None, None, :]).astype(o_BNTH.dtype)

    def _dense(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask, with_stats: bool, score_probe_BNTS, normalize=None):
        out_BNTH, stats = super()._dense(q_BNTH, k_BNSH, v_BNSH, mask, with_stats, score_probe_BNTS, normalize)
        return self.head_norm(out_BNTH), stats

    def block_form(self):
        """Softmax's blockwise form, run on each half (`blockwise_call`)."""
        return self.capped(BlockForm("exp", {"beta": self.beta()}, scaled_logits))

    def blockwise_call(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask):
        """o₁ − λ·o₂ from two blockwise softmax scans over the halves (sharing v), then the RMS norm."""
        form = self.block_form()
        o1, o2 = (
            blockwise.attention(form, q, k, v_BNSH, mask, self.block_size).astype(jnp.float32)
            for q, k in zip(self._halves(q_BNTH), self._halves(k_BNSH), strict=True)
        )
        return self.head_norm(o1 - self.lam() * o2).astype(v_BNSH.dtype)

    # --- float64 references ----------------------------------------------------------------------------------------

    def _reference_lambda_init(self) -> float:
        if self.fixed_lambda_init is not None:
            return float(self.fixed_lambda_init)
        layer = float(np.asarray(self.layer_index[...]))  # 0-based: the paper's l − 1
        return 0.8 - 0.6 * math.exp(-0.3 * layer)

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64 numpy (weights_BNTS, logits_BNTS, extras), row by row over the admissible keys: softmax of the first
        halves' βz minus λ times that of the second halves', λ and λ_init from their formulas."""
        q, k = np.asarray(q_BNTH, np.float64), np.asarray(k_BNSH, np.float64)
        h = q.shape[-1] // 2
        beta_N = np.asarray(self.beta(), np.float64)
        x1 = beta_N[None, :, None, None] * np.einsum("bnth,bnsh->bnts", q[..., :h], k[..., :h])
        x2 = beta_N[None, :, None, None] * np.einsum("bnth,bnsh->bnts", q[..., h : 2 * h], k[..., h : 2 * h])
        if self.softcap is not None:
            x1, x2 = (self.softcap * np.tanh(x / self.softcap) for x in (x1, x2))
        lq1, lk1, lq2, lk2 = np.asarray(self.lambda_qk[...], np.float64)
        lam = math.exp(lq1 @ lk1) - math.exp(lq2 @ lk2) + self._reference_lambda_init()
        p1, w = np.zeros_like(x1), np.zeros_like(x1)
        for b, n, t in np.ndindex(x1.shape[:3]):
            idx = np.flatnonzero(admissible_BTS[b, t])
            if idx.size:
                p1[b, n, t, idx] = ref.softmax_np(x1[b, n, t, idx])
                w[b, n, t, idx] = p1[b, n, t, idx] - lam * ref.softmax_np(x2[b, n, t, idx])
        logits = np.where(np.abs(x1) >= np.abs(x2), x1, x2)
        entropy = ref.core_stats(p1, x1, admissible_BTS)["entropy"]
        return w, logits, {"beta": beta_N, "diff_lambda": np.full(beta_N.shape, lam), "entropy": entropy}

    def reference_output(self, w_BNTS, v_BNSH):
        """Float64 (1 − λ_init)·g ⊙ o/√(mean o² + eps) of o = w·v, each head and row (the code's subln)."""
        o = np.einsum("bnts,bnsh->bnth", np.asarray(w_BNTS, np.float64), np.asarray(v_BNSH, np.float64))
        rms = np.sqrt(np.mean(o**2, axis=-1, keepdims=True) + RMS_EPS)
        g = np.asarray(self.head_scale[...], np.float64)
        return (1.0 - self._reference_lambda_init()) * g * o / rms
