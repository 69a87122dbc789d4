"""The per-head attention statistics: each declared once (STATISTICS), with how it is computed on a block of query
rows, its TensorBoard description and chart, and whether it enters the final metrics and the histograms.

A statistic reads a block of rows through `Rows`, which has two forms: `WeightRows`, from the weights (the dense
form's whole T×S matrix, or the weights of sampled rows: backends/sampled_rows.py), and `SoftmaxRows`, from the
logits x of weights masked_softmax(x) without building them (the sampled rows of a softmax-family normalizer beside
a fused kernel). A statistic written from the row quantities both forms give (mass, entropy, largest weight, the weight
at a key position) is computed the same way by each; `core_stats` and `softmax_stats` compute every one.
Statistics a normalizer computes itself (its extras: β, KL to the prior, ...) are declared with `of_rows=None`. Its
extras also replace a statistic of rows that its weights leave undefined: the entropy of signed weights (a normalizer
that says `signed_weights`; differential attention reports its first softmax map's).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp

from attnlab.backends.mask import masked_max


class Rows:
    """A block of R query rows (R = T for the dense form): per-row quantities, each computed when first read.

    Shape letters as in base.py; R query rows. `m_B1RS` is the admissible mask of the rows, `logits_BNRS` what the
    normalizer acts on (the scaled scores)."""

    def __init__(self, logits_BNRS, m_B1RS, q_pos_R=None):
        self.logits_BNRS, self.m_B1RS = logits_BNRS, m_B1RS
        R, S = m_B1RS.shape[-2:]
        # The rows' query positions among the S keys; default: the queries are the last R keys (the dense form).
        self.q_pos_R = jnp.arange(R) + (S - R) if q_pos_R is None else jnp.asarray(q_pos_R)

    @functools.cached_property
    def n_B1R(self):
        """Admissible keys of each row."""
        return self.m_B1RS.sum(-1)

    @functools.cached_property
    def first_key_B1R(self):
        """The position of each row's first admissible key (0 for a row with none)."""
        return jnp.argmax(self.m_B1RS, axis=-1)

    @functools.cached_property
    def own_key_B1R(self):
        """The position of each row's own query among the keys (clipped into range)."""
        S = self.m_B1RS.shape[-1]
        return jnp.broadcast_to(jnp.clip(self.q_pos_R, 0, S - 1), self.n_B1R.shape)

    @functools.cached_property
    def own_admissible_B1R(self):
        """Whether each row may attend to its own position."""
        return jnp.take_along_axis(self.m_B1RS, self.own_key_B1R[..., None], -1)[..., 0]

    mass_BNR: jax.Array  # Σ of a row's weights
    entropy_BNR: jax.Array  # the entropy (nats) of a row's weights renormalised to sum 1
    max_weight_BNR: jax.Array  # a row's largest weight

    def weight_at(self, key_B1R) -> jax.Array:
        """(B,N,R) the weight of each row at key position key_B1R[b, 0, r]."""
        raise NotImplementedError


class WeightRows(Rows):
    """Rows from their weights att_BNRS (padding and masked keys read as 0)."""

    def __init__(self, att_BNRS, logits_BNRS, m_B1RS, q_pos_R=None):
        super().__init__(logits_BNRS, m_B1RS, q_pos_R)
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

    def __init__(self, x_BNRS, logits_BNRS, m_B1RS, q_pos_R=None):
        super().__init__(logits_BNRS, m_B1RS, q_pos_R)
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


def _first_weight(rows: Rows):
    # Gu et al. 2024 ("When Attention Sink Emerges", Eq. 1): a head's mean weight on the first token; here the
    # first key a row may see, so a window or left-out prefix moves it.
    return rows.weight_at(rows.first_key_B1R), rows_with_keys(rows)


def _self_weight(rows: Rows):
    return rows.weight_at(rows.own_key_B1R), jnp.broadcast_to(rows.own_admissible_B1R, rows.mass_BNR.shape)


def _max_logit(rows: Rows):
    return jnp.where(rows.m_B1RS, jnp.abs(rows.logits_BNRS.astype(jnp.float32)), 0.0).max(-1), None


def dormant_first_weight(maps_LBNTS, rows_BT) -> jax.Array:
    """(L, B, N) the mean weight on the first key over each example's `rows_BT` that see two or more keys (NaN for an
    example with none)."""
    rows_BT = rows_BT & (jnp.arange(rows_BT.shape[1]) >= 1)[None]
    w_LBNT = maps_LBNTS[..., 0].astype(jnp.float32)
    count_B = rows_BT.sum(-1)
    return (
        jnp.where(rows_BT[None, :, None], w_LBNT, 0.0).sum(-1) / jnp.where(count_B > 0, count_B, jnp.nan)[None, :, None]
    )


DIRECTIONS = ("higher", "lower", None)
FINALS = ("layer", "head", None)


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
    # in the final metrics at each test length and the report (statistics.final): "layer", attn_<name>/layer_i (mean
    # over heads); "head", attn_<name>/layer_i/head_h too; None: not there
    final: str | None = None
    rate: str | None = None  # a final statistic's share of heads past SINK_EPSILON, attn_<rate>(/layer_i)
    # (L, B, N) per example from the explicit attention weights and the rows it reads (final metrics only); None: from
    # the per-head statistics the blocks return
    of_maps: Callable | None = None
    histogram: bool = False  # hist/<name> of its per-layer values on eval steps
    direction: str | None = None  # "higher" | "lower": which values are better; None: descriptive, neither is
    extreme: bool = False  # the residual stream's (Transformer.extreme_token_stats): only a model asked for them has it

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"statistic {self.name}: direction={self.direction!r}; allowed: {DIRECTIONS}")
        if self.final not in FINALS:
            raise ValueError(f"statistic {self.name}: final={self.final!r}; allowed: {FINALS}")

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
        "attention entropy H / log n over the admissible keys, rows renormalised (1 = uniform, 0 = one key; "
        "differential: of its first softmax map); mean over heads for layer_i",
        _entropy,
        chart="entropy (mean over heads)",
        final="layer",
        histogram=True,
    ),
    Statistic(
        "max_weight",
        "largest attention weight of a query row, mean over rows (and heads for layer_i)",
        lambda rows: (rows.max_weight_BNR, rows_with_keys(rows)),
        chart="max weight (mean over heads)",
        final="layer",
    ),
    Statistic(
        "first_weight",
        "weight of a query row on its first admissible key (the attention sink's mass; Gu et al. 2024), mean over "
        "rows (and heads for layer_i); sink_rate is the share of heads whose mean exceeds 0.3",
        _first_weight,
        chart="first-key weight (mean over heads)",
        final="head",
        rate="sink_rate",
    ),
    Statistic(
        "self_weight",
        "weight of a query row on its own position, mean over rows that may see it (and heads for layer_i)",
        _self_weight,
        chart="own-position weight (mean over heads)",
        final="head",
    ),
    Statistic(
        "row_mass",
        "sum of a query row's weights (1 for softmax; 1 − λ for differential; varies for sigmoid, relu, softpick, "
        "sink, linear)",
        lambda rows: (rows.mass_BNR, rows_with_keys(rows)),
        final="layer",  # beside first_weight: a row that is not sum-to-one can put little mass anywhere
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
    Statistic("zero_share", "share of a row's admissible keys weighted exactly 0, mean over rows (softpick)", None),
    Statistic("sink_logit", "the sink's logit b of each head, e^b/(e^b + Σe^x) its weight (sink)", None),
    Statistic("forget_gate", "forget gate f of a key, mean over the keys a query may see (forgetting)", None),
    Statistic("diff_lambda", "differential attention's λ, the second map's weight (one per layer, each head)", None),
    Statistic(
        "massive_ratio",
        "the residual stream after the block: largest |activation| over the median |activation| of the valid "
        "tokens' entries (Sun et al. 2024, Massive Activations); one value per layer, repeated per head",
        None,
        chart="residual max/median |x|",
        final="layer",
        extreme=True,
    ),
    Statistic(
        "kurtosis",
        "the residual stream after the block: kurtosis E[(x-mean)^4]/var^2 of the valid tokens' entries (3 for a "
        "Gaussian; Zuhri et al. 2025, softpick); one value per layer, repeated per head",
        None,
        chart="residual kurtosis",
        final="layer",
        extreme=True,
    ),
    Statistic("gate_mean", "output gate σ(x·W) of a head, mean over valid tokens (model.output_gate)", None),
    Statistic(
        "value_drain",
        "the first token's value norm ‖v_0‖ over the median ‖v_t‖ of the other valid tokens, per head, mean over "
        "examples (Guo et al. 2024's value-state drain: a sink token's value shrinks towards 0, so < 1)",
        None,
        chart="first token's ‖v‖ / median (mean over heads)",
        final="layer",
        extreme=True,
    ),
    Statistic(
        "residual_peak",
        "the residual stream after the block: the first token's norm ‖x_0‖ over the median ‖x_t‖ of the other valid "
        "tokens, mean over examples (Guo et al. 2024's residual-state peak: ≫ 1); one value per layer, repeated per "
        "head",
        None,
        chart="first token's residual ‖x‖ / median",
        final="layer",
        extreme=True,
    ),
    Statistic(
        "dormant_first_weight",
        "weight of a dormant query row on the first key, mean over the rows with two or more admissible keys (Guo et "
        "al. 2024: rows where the head has nothing to do, the task's `dormant` row group; every row where a task marks "
        "none); final metrics only, from the explicit attention weights; dormant_sink_rate is the share of heads "
        "whose mean exceeds ε = 0.3, as sink_rate's",
        None,
        final="head",
        rate="dormant_sink_rate",
        of_maps=dormant_first_weight,
    ),
)

# Every statistic above describes what attention does (how much weight the first key takes, how spread a row is, how
# large the residual stream's outliers are); none is better higher or lower in itself: a sink is what softmax's
# sum-to-one does with spare mass (Gu et al. 2024; Xiao et al. 2024), not a defect, and the task decides what weight
# a head should put where. So each direction stays None until a statistic comes with a reason for one.

BY_NAME = {s.name: s for s in STATISTICS}
CORE_STATS = tuple(s.name for s in STATISTICS if s.of_rows is not None)  # those every normalizer reports
# The rates the final metrics derive from a statistic (attn_<rate>, per layer and overall: train/evaluation.py):
# shares of heads past SINK_EPSILON, descriptive as the weights they count.
DERIVED_RATES = {s.rate: None for s in STATISTICS if s.rate}


def directions() -> dict[str, str | None]:
    """{"attn_<name>": "higher" | "lower" | None} of every statistic and derived rate: which values are better (None:
    neither). metrics.json records it, so that attnlab-report, which imports neither jax nor this module, reads the
    direction of a run's attn_ metrics from the run."""
    return {**{f"attn_{s.name}": s.direction for s in STATISTICS}, **{f"attn_{k}": d for k, d in DERIVED_RATES.items()}}


# Gu et al. 2024: a head is a sink head when its mean first-token weight exceeds this ε.
SINK_EPSILON = 0.3


def sink_rate(first_weight_LN) -> jax.Array:
    """(L,) share of each layer's heads whose mean first-key weight exceeds SINK_EPSILON (NaN heads count as none)."""
    return jnp.mean(jnp.asarray(first_weight_LN) > SINK_EPSILON, -1)


def per_head(rows: Rows) -> dict[str, jax.Array]:
    """{name: (N,)} of every statistic computed from rows (CORE_STATS)."""
    return {s.name: s.per_head(rows) for s in STATISTICS if s.of_rows is not None}


def core_stats(att_BNTS, logits_BNTS, m_B1TS, q_pos_T=None) -> dict[str, jax.Array]:
    """CORE_STATS of the weights att_BNTS (the dense form's, or sampled rows' at query positions q_pos_T)."""
    return per_head(WeightRows(att_BNTS, logits_BNTS, m_B1TS, q_pos_T))


def softmax_stats(x_BNTS, logits_BNTS, m_B1TS, q_pos_T=None) -> dict[str, jax.Array]:
    """CORE_STATS of the weights masked_softmax(x), from x without building them (SoftmaxRows)."""
    return per_head(SoftmaxRows(x_BNTS, logits_BNTS, m_B1TS, q_pos_T))
