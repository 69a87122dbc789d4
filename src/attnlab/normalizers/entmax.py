"""α-entmax attention (Peters, Niculae & Martins 2019; deep-spin/entmax): sparse for α > 1, α = 2 is sparsemax."""

from __future__ import annotations

import types
from functools import partial

import jax
import jax.numpy as jnp

from attnlab.backends.mask import MASK_GAP, masked_max
from attnlab.options import normalizers as normalizer_options

from . import reference as ref
from .base import ScoreNormalizer

BISECTION_STEPS = 50


def _ranks(x):
    """1..n along the last axis of x, with x's rank (no silent rank promotion)."""
    return jnp.expand_dims(jnp.arange(1, x.shape[-1] + 1, dtype=x.dtype), tuple(range(x.ndim - 1)))


def _sparsemax_tau(x):
    """Sparsemax threshold by sorting (Martins & Astudillo 2016): k = max{j : 1 + j·x₍ⱼ₎ > Σ_{i≤j} x₍ᵢ₎}."""
    xs = jnp.flip(jnp.sort(x, -1), -1)
    cs = jnp.cumsum(xs, -1)
    j = _ranks(x)
    k = jnp.sum(1 + j * xs > cs, -1, keepdims=True)
    return (jnp.take_along_axis(cs, k - 1, -1) - 1) / k


def _entmax15_tau(x):
    """Exact 1.5-entmax threshold by sorting (Peters et al. 2019, Alg. 2; x already scaled by α−1 = ½)."""
    xs = jnp.flip(jnp.sort(x, -1), -1)
    rho = _ranks(x)
    mean = jnp.cumsum(xs, -1) / rho
    mean_sq = jnp.cumsum(xs**2, -1) / rho
    delta = (1 - rho * (mean_sq - mean**2)) / rho
    tau = mean - jnp.sqrt(jnp.maximum(delta, 0))
    k = jnp.sum(tau <= xs, -1, keepdims=True)
    return jnp.take_along_axis(tau, k - 1, -1)


def _bisection_tau(x, alpha):
    """τ with Σ max(x − τ, 0)^{1/(α−1)} = 1, by bisection on [max − 1, max − n^{1−α}] (entmax_bisect)."""
    mx = x.max(-1, keepdims=True)
    lo, hi = mx - 1.0, mx - x.shape[-1] ** (1.0 - alpha)

    def body(_, bounds):
        lo, hi = bounds
        tau = (lo + hi) / 2
        mass = jnp.sum(jnp.maximum(x - tau, 0) ** (1.0 / (alpha - 1)), -1, keepdims=True)
        return jnp.where(mass >= 1, tau, lo), jnp.where(mass >= 1, hi, tau)

    lo, hi = jax.lax.fori_loop(0, BISECTION_STEPS, body, (lo, hi))
    return (lo + hi) / 2


@partial(jax.custom_jvp, nondiff_argnums=(1,))
def entmax(x, alpha: float):
    """α-entmax over the last axis: exact for α ∈ {1.5, 2}, bisection (then renormalised) otherwise."""
    xa = (alpha - 1) * x
    xa = xa - jax.lax.stop_gradient(xa.max(-1, keepdims=True))
    if alpha == 2:
        return jnp.maximum(xa - _sparsemax_tau(xa), 0)
    if alpha == 1.5:
        return jnp.maximum(xa - _entmax15_tau(xa), 0) ** 2
    p = jnp.maximum(xa - _bisection_tau(xa, alpha), 0) ** (1.0 / (alpha - 1))
    return p / p.sum(-1, keepdims=True)


@entmax.defjvp
def _entmax_jvp(alpha, primals, tangents):
    # Implicit gradient (deep-spin/entmax EntmaxBisectFunction.backward): J = diag(s) − ssᵀ/Σs,
    # s = p^{2−α} on the support. At α → 1 this is softmax's diag(p) − ppᵀ.
    (x,), (dx,) = primals, tangents
    p = entmax(x, alpha)
    s = jnp.where(p > 0, p ** (2 - alpha), 0.0)
    sdx = s * dx
    return p, sdx - s * sdx.sum(-1, keepdims=True) / s.sum(-1, keepdims=True)


class Entmax(ScoreNormalizer):
    """α-entmax(βz) over admissible keys; β sets the support size (sparsemax is not scale-invariant)."""

    # the two closed forms (α = 1.5, sparsemax at 2) and the bisection of any other α
    check_variants = types.MappingProxyType(
        {"alpha1.5": {"alpha": 1.5}, "alpha2": {"alpha": 2.0}, "alpha1.3": {"alpha": 1.3}}
    )

    def __init__(self, *, alpha=1.5, **shared):
        normalizer_options.entmax(alpha=alpha)
        self.alpha = float(alpha)
        super().__init__(**shared)

    def normalize(self, z_BNTS, m_B1TS):
        beta_N = self.beta()
        logits_BNTS = beta_N[None, :, None, None] * z_BNTS
        # A large *finite* gap below the row max keeps masked keys out of the support without -inf.
        x = jnp.where(m_B1TS, logits_BNTS, masked_max(logits_BNTS, m_B1TS) - MASK_GAP * self.alpha / (self.alpha - 1))
        att_BNTS = jnp.where(m_B1TS.any(-1, keepdims=True) & m_B1TS, entmax(x, self.alpha), 0.0)
        return att_BNTS, logits_BNTS, {"beta": beta_N}

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64: α-entmax(βz) over the admissible keys (sparsemax by sorting at α = 2, bisection otherwise)."""
        beta_N = ref.inverse_temperature(self, q_BNTH.shape[1])
        x_BNTS = beta_N[None, :, None, None] * ref.scores(q_BNTH, k_BNSH)
        w = ref.rowwise(lambda r, *_: ref.entmax_np(r, self.alpha), x_BNTS, admissible_BTS)
        return w, x_BNTS, {"beta": beta_N}
