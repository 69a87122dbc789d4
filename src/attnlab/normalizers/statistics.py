"""The per-head attention statistics: each declared once (STATISTICS), with how it is computed on a block of query
rows, its TensorBoard description and chart, and whether it enters the final metrics and the histograms.

A statistic reads a block of rows through `Rows`, which has two forms: `WeightRows`, from the weights (the dense
form's whole T×S matrix, or the weights of sampled rows: sampled_rows.py), and `SoftmaxRows`, from the logits x of
weights masked_softmax(x) without building them (the sampled rows of a softmax-family normalizer beside a fused
kernel). A statistic written from the row quantities both forms give (mass, entropy, largest weight, the weight
at a key position) is computed the same way by each; `core_stats` and `softmax_stats` compute every one.
Statistics a normalizer computes itself (its extras: β, KL to the prior, ...) are declared with `of_rows=None`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp

from .mask import masked_max


class Rows:
    """A block of R query rows (R = T for the dense form): per-row quantities, each computed when first read.

    Shape letters as in base.py; R query rows. `m_B1RS` is the admissible mask of the rows, `logits_BNRS` what the
    normalizer acts on (the scaled scores)."""

    def __init__(self, logits_BNRS, m_B1RS):
        self.logits_BNRS, self.m_B1RS = logits_BNRS, m_B1RS

    @functools.cached_property
    def n_B1R(self):
        """Admissible keys of each row."""
        return self.m_B1RS.sum(-1)

    @functools.cached_property
    def first_key_B1R(self):
        """The position of each row's first admissible key (0 for a row with none)."""
        return jnp.argmax(self.m_B1RS, axis=-1)

    mass_BNR: jax.Array  # Σ of a row's weights
    entropy_BNR: jax.Array  # the entropy (nats) of a row's weights renormalised to sum 1
    max_weight_BNR: jax.Array  # a row's largest weight

    def weight_at(self, key_B1R) -> jax.Array:
        """(B,N,R) the weight of each row at key position key_B1R[b, 0, r]."""
        raise NotImplementedError


class WeightRows(Rows):
    """Rows from their weights att_BNRS (padding and masked keys read as 0)."""

    def __init__(self, att_BNRS, logits_BNRS, m_B1RS):
        super().__init__(logits_BNRS, m_B1RS)
        self.att_BNRS = jnp.where(m_B1RS, att_BNRS.astype(jnp.float32), 0.0)

    @functools.cached_property
    def mass_BNR(self):
        return self.att_BNRS.sum(-1)

    @functools.cached_property
    def entropy_BNR(self):
        p = self.att_BNRS / jnp.where(self.mass_BNR > 0, self.mass_BNR, 1.0)[..., None]
        return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), -1)

    @functools.cached_property
    def max_weight_BNR(self):
        return self.att_BNRS.max(-1)

    def weight_at(self, key_B1R):
        key_BNR1 = jnp.broadcast_to(key_B1R, self.mass_BNR.shape)[..., None]
        return jnp.take_along_axis(self.att_BNRS, key_BNR1, -1)[..., 0]


class SoftmaxRows(Rows):
    """Rows whose weights are masked_softmax(x_BNRS), from x without building them.

    With d = x − max x over a row's admissible keys and l = Σ e^d: a weight is e^d / l, the largest 1/l, the
    entropy log l − Σ e^d·d / l, the mass 1. Two reductions over x instead of the weights' write and their passes
    (BENCHMARKS.md, the logging step)."""

    def __init__(self, x_BNRS, logits_BNRS, m_B1RS):
        super().__init__(logits_BNRS, m_B1RS)
        x = x_BNRS.astype(jnp.float32)
        self.d_BNRS = jnp.where(m_B1RS, x - masked_max(x, m_B1RS), 0.0)
        self.e_BNRS = jnp.where(m_B1RS, jnp.exp(self.d_BNRS), 0.0)
        l_BNR = self.e_BNRS.sum(-1)
        self.has_keys_BNR = l_BNR > 0
        self.l_BNR = jnp.where(self.has_keys_BNR, l_BNR, 1.0)

    @functools.cached_property
    def mass_BNR(self):
        return self.has_keys_BNR.astype(jnp.float32)

    @functools.cached_property
    def entropy_BNR(self):
        return jnp.log(self.l_BNR) - jnp.sum(self.e_BNRS * self.d_BNRS, -1) / self.l_BNR

    @functools.cached_property
    def max_weight_BNR(self):
        return jnp.where(self.has_keys_BNR, 1.0 / self.l_BNR, 0.0)

    def weight_at(self, key_B1R):
        key_BNR1 = jnp.broadcast_to(key_B1R, self.l_BNR.shape)[..., None]
        return jnp.take_along_axis(self.e_BNRS, key_BNR1, -1)[..., 0] / self.l_BNR


def rows_with_keys(rows: Rows):
    """Rows with at least one admissible key."""
    return jnp.broadcast_to(rows.n_B1R >= 1, rows.mass_BNR.shape)


def _entropy(rows: Rows):
    # H / log n over rows with n ≥ 2 and mass > 0: a causal row i has at most log n_i nats, so normalising
    # keeps the mean from being dominated by sequence length.
    return rows.entropy_BNR / jnp.log(jnp.maximum(rows.n_B1R, 2)), (rows.n_B1R >= 2) & (rows.mass_BNR > 0)


def _max_logit(rows: Rows):
    return jnp.where(rows.m_B1RS, jnp.abs(rows.logits_BNRS.astype(jnp.float32)), 0.0).max(-1), None


@dataclasses.dataclass(frozen=True)
class Statistic:
    """One per-head statistic, logged as attn_<name>/layer_i (mean over heads) and attn_<name>/layer_i/head_h."""

    name: str
    description: str  # the TensorBoard tooltip of its tags
    # (values_BNR, rows_BNR | None) of a block of rows; the statistic is the mean of the values over those rows
    # (every row where None), per head; None: a normalizer's own (its `normalize` extras)
    of_rows: Callable[[Rows], tuple] | None
    reduce: str = "mean"  # mean | max over rows (and batch)
    chart: str | None = None  # the title of its per-layer chart in the custom-scalars layout
    final: bool = False  # in the final metrics at each test length (test_len/<T>/attn_<name>/layer_i) and the report
    histogram: bool = False  # hist/<name> of its per-layer values on eval steps

    def per_head(self, rows: Rows) -> jax.Array:
        """(N,) from a block of rows."""
        values_BNR, ok_BNR = self.of_rows(rows)
        if self.reduce == "max":
            return values_BNR.max((0, 2))
        ok_BNR = jnp.broadcast_to(True if ok_BNR is None else ok_BNR, values_BNR.shape)
        return jnp.sum(jnp.where(ok_BNR, values_BNR, 0.0), (0, 2)) / jnp.maximum(jnp.sum(ok_BNR, (0, 2)), 1)


STATISTICS = (
    Statistic(
        "entropy",
        "attention entropy H / log n over the admissible keys, rows renormalised (1 = uniform, 0 = one key); "
        "mean over heads for layer_i",
        _entropy,
        chart="entropy (mean over heads)",
        final=True,
        histogram=True,
    ),
    Statistic(
        "max_weight",
        "largest attention weight of a query row, mean over rows (and heads for layer_i)",
        lambda rows: (rows.max_weight_BNR, rows_with_keys(rows)),
        chart="max weight (mean over heads)",
        final=True,
    ),
    Statistic(
        "row_mass",
        "sum of a query row's weights (1 for softmax; varies for sigmoid, relu, linear)",
        lambda rows: (rows.mass_BNR, rows_with_keys(rows)),
    ),
    Statistic(
        "max_logit",
        "largest |logit| the normalizer saw (max over batch, rows and keys)",
        _max_logit,
        reduce="max",
    ),
    Statistic(
        "beta", "inverse temperature β of each head (ssmax: its β of a row, mean over rows)", None, histogram=True
    ),
    Statistic("kl_prior", "KL(π‖u) of a row's weights π to kl's prior u, mean over rows", None),
    Statistic("objective", "the optimum LSE(βz + log u)/β of kl's objective, mean over rows", None),
    Statistic("min_denominator", "smallest denominator of a row with admissible keys (squared, linear)", None),
    Statistic("leftover", "mass a row leaves unassigned, 1 − Σ weights, mean over rows (stickbreaking)", None),
    Statistic("s", "ssmax's length scale s of each head", None),
)

BY_NAME = {s.name: s for s in STATISTICS}
CORE_STATS = tuple(s.name for s in STATISTICS if s.of_rows is not None)  # those every normalizer reports


def per_head(rows: Rows) -> dict[str, jax.Array]:
    """{name: (N,)} of every statistic computed from rows (CORE_STATS)."""
    return {s.name: s.per_head(rows) for s in STATISTICS if s.of_rows is not None}


def core_stats(att_BNTS, logits_BNTS, m_B1TS) -> dict[str, jax.Array]:
    """CORE_STATS of the weights att_BNTS (the dense form's, or sampled rows')."""
    return per_head(WeightRows(att_BNTS, logits_BNTS, m_B1TS))


def softmax_stats(x_BNTS, logits_BNTS, m_B1TS) -> dict[str, jax.Array]:
    """CORE_STATS of the weights masked_softmax(x), from x without building them (SoftmaxRows)."""
    return per_head(SoftmaxRows(x_BNTS, logits_BNTS, m_B1TS))
