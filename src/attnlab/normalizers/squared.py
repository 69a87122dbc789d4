"""Power ("squared") attention: pᵢᵖ/Σⱼpⱼᵖ over admissible keys (Qin et al. 2022, "The Devil in Linear Transformer")."""

from __future__ import annotations

import math
import types
import warnings

import jax.numpy as jnp
import numpy as np

from attnlab.backends.blockwise import BlockForm, power_gate, scaled_logits
from attnlab.options import normalizers as normalizer_options

from . import reference as ref
from .base import ScoreNormalizer


class Squared(ScoreNormalizer):
    """wᵢ = f(βzᵢ)/(Σⱼ f(βzⱼ) + eps), f(x) = |x|ᵖ, or with `offset` the Taylor polynomial of exp
    of degree p, Σ_{k≤p} xᵏ/k! (1 + x + x²/2 for p = 2), which is positive for even p.

    The plain form is scale-invariant (β cancels up to eps) and sign-blind (z and −z weigh the
    same); its denominator can approach 0 — exposed as the `min_denominator` statistic so the
    instability can be studied (Qin et al. 2022). eps = 0 is allowed on purpose.
    """

    # the Taylor polynomial (offset) at p = 2 and 4, an odd power, and eps at 0 (its division by zero) and large
    check_variants = types.MappingProxyType(
        {
            "plain": {},
            "offset": {"offset": True},
            "eps0": {"eps": 0.0},
            "eps0.1": {"eps": 0.1},
            "power3": {"power": 3},
            "offset-power4": {"offset": True, "power": 4},
        }
    )

    def __init__(
        self,
        *,
        power=2,
        eps=1e-6,
        offset=False,
        learnable=False,
        **shared,
    ):
        normalizer_options.squared(power=power, eps=eps, offset=offset)
        if learnable and not offset:
            warnings.warn(
                "squared attention without offset is scale-invariant: a learnable beta has no "
                "effect (set normalizer.offset=true or normalizer.learnable=false)",
                stacklevel=2,
            )
        self.power, self.eps, self.offset = power, float(eps), bool(offset)
        super().__init__(learnable=learnable, **shared)

    def block_form(self):
        return self.capped(
            BlockForm(
                "sum", {"beta": self.beta()}, scaled_logits, gate=power_gate(self.power, self.offset), eps=self.eps
            )
        )

    def normalize(self, z_BNTS, m_B1TS):
        beta_N = self.beta()
        x_BNTS = beta_N[None, :, None, None] * z_BNTS
        f_BNTS = jnp.where(m_B1TS, power_gate(self.power, self.offset)(x_BNTS), 0.0)
        den_BNT1 = f_BNTS.sum(-1, keepdims=True)
        has_keys = jnp.broadcast_to(m_B1TS.any(-1, keepdims=True), den_BNT1.shape)
        # A row with no admissible key is all zeros even at eps = 0; a row whose keys all score 0
        # is the instability itself and stays 0/0 there.
        att_BNTS = f_BNTS / jnp.where(has_keys, den_BNT1 + self.eps, 1.0)
        # min over rows that have at least one admissible key (empty rows have no denominator).
        min_den_N = jnp.where(has_keys, den_BNT1, jnp.inf).min((0, 2, 3))
        return att_BNTS, x_BNTS, {"beta": beta_N, "min_denominator": min_den_N}

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64: f(βzᵢ)/(Σⱼ f(βzⱼ) + eps) over the admissible keys, f(x) = |x|ᵖ or Σ_{k≤p} xᵏ/k! (offset);
        min_denominator the least Σⱼ f of a row with a key."""
        beta_N = ref.inverse_temperature(self, q_BNTH.shape[1])
        x_BNTS = beta_N[None, :, None, None] * ref.scores(q_BNTH, k_BNSH)
        p = self.power

        def f(x):
            return sum(x**j / math.factorial(j) for j in range(p + 1)) if self.offset else np.abs(x) ** p

        w = ref.rowwise(lambda r, *_: f(r) / (f(r).sum() + self.eps), x_BNTS, admissible_BTS)
        den_N = ref.min_row_sum(np.where(admissible_BTS[:, None], f(x_BNTS), 0.0), admissible_BTS)
        return w, x_BNTS, {"beta": beta_N, "min_denominator": den_N}
