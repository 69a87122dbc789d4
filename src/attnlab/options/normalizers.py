"""The normalizer group's options (attnlab.normalizers), checked without jax. `normalizer.impl` is checked when the
normalizer is built: the backends it may name follow from its forms (impl.allowed of its capability)."""

from __future__ import annotations

from attnlab import checks

ADAPTIVE_MODES = ("off", "eval", "train")
PRIORS = ("uniform", "recency", "learned")  # kl's
FEATURE_MAPS = ("elu1", "relu", "favor")  # linear's


def inverse_temperature(*, beta, learnable, per_head) -> None:
    """β (null: 1/√d) and how it is trained: every ScoreNormalizer's (normalizers.base.InverseTemperature)."""
    if beta is not None:
        checks.real("normalizer.beta", beta, 0, 1e6, lo_open=True)
    checks.boolean("normalizer.learnable", learnable)
    checks.boolean("normalizer.per_head", per_head)


def softcap(*, softcap) -> None:
    """The soft cap c on βz (null: off): every ScoreNormalizer's."""
    if softcap is not None:
        checks.real("normalizer.softcap", softcap, 0, 1e6, lo_open=True)


def block_size(*, block_size) -> None:
    """The blockwise form's block length: every ScoreNormalizer's."""
    checks.integer("normalizer.block_size", block_size, 1)


def adaptive_temperature(*, adaptive_temperature) -> None:
    """softmax's and kl's (normalizers.exponential.AdaptiveTemperature)."""
    checks.choice("normalizer.adaptive_temperature", adaptive_temperature, ADAPTIVE_MODES)


# The options every ScoreNormalizer takes, in the order ScoreNormalizer.__init__ checks them.
SCORED = (inverse_temperature, softcap, block_size)


def differential(*, lambda_init, learnable_lambda) -> None:
    if lambda_init is not None:  # null: the schedule by layer
        checks.real("normalizer.lambda_init", lambda_init, 0.0, 1.0, hi_open=True)
    checks.boolean("normalizer.learnable_lambda", learnable_lambda)


def entmax(*, alpha) -> None:
    checks.real("normalizer.alpha", alpha, 1.0, 100.0, lo_open=True)  # alpha -> 1 is softmax: normalizer=softmax


def forgetting(*, gate_bias) -> None:
    checks.real("normalizer.gate_bias", gate_bias, -100.0, 100.0)


def kl(*, prior, slope, max_distance) -> None:
    checks.choice("normalizer.prior", prior, PRIORS)
    checks.real("normalizer.slope", slope, 0, 1e6, lo_open=True)
    checks.integer("normalizer.max_distance", max_distance, 1, 2**20)


def linear(*, feature_map, eps, chunk_size, num_features) -> None:
    checks.choice("normalizer.feature_map", feature_map, FEATURE_MAPS)
    checks.real("normalizer.eps", eps, 0.0, 1e6)
    checks.integer("normalizer.chunk_size", chunk_size, 1, 2**20)
    checks.integer("normalizer.num_features", num_features, 1, 2**16)


def sigmoid(*, bias) -> None:
    if bias is not None:  # null: −log n
        checks.real("normalizer.bias", bias, -1e6, 1e6)


def sink(*, sink, learnable_sink) -> None:
    checks.real("normalizer.sink", sink, -1e4, 1e4)
    checks.boolean("normalizer.learnable_sink", learnable_sink)


def softpick(*, eps) -> None:
    checks.real("normalizer.eps", eps, 0.0, 1.0)


def squared(*, power, eps, offset) -> None:
    checks.integer("normalizer.power", power, 1, 64)  # |x|^p overflows float32 long before p = 64
    checks.real("normalizer.eps", eps, 0.0, 1e6)
    checks.boolean("normalizer.offset", offset)
    # odd Taylor polynomials go negative, so the offset form needs an even power
    checks.require(
        not (offset and power % 2),
        f"normalizer.offset=true with normalizer.power={power} is invalid; allowed: an even normalizer.power",
    )


def ssmax(*, s, learnable, beta, bias) -> None:
    """ssmax's own, its fixed β among them (it takes no per_head)."""
    checks.real("normalizer.s", s, -1e6, 1e6)
    checks.boolean("normalizer.learnable", learnable)
    if beta is not None:
        checks.real("normalizer.beta", beta, 0, 1e6, lo_open=True)
    checks.boolean("normalizer.bias", bias)


def stickbreaking(*, attend_current) -> None:
    checks.boolean("normalizer.attend_current", attend_current)


DECLARED = {
    "attnlab.normalizers.Differential": (differential, *SCORED),
    "attnlab.normalizers.Entmax": (entmax, *SCORED),
    "attnlab.normalizers.Forgetting": (forgetting, *SCORED),
    "attnlab.normalizers.KL": (kl, *SCORED, adaptive_temperature),
    "attnlab.normalizers.Linear": (linear,),
    "attnlab.normalizers.ReLU": SCORED,
    "attnlab.normalizers.SSMax": (ssmax, softcap, block_size),
    "attnlab.normalizers.Sigmoid": (sigmoid, *SCORED),
    "attnlab.normalizers.Sink": (sink, *SCORED),
    "attnlab.normalizers.Softmax": (*SCORED, adaptive_temperature),
    "attnlab.normalizers.Softmax1": SCORED,
    "attnlab.normalizers.Softpick": (softpick, *SCORED),
    "attnlab.normalizers.Squared": (squared, *SCORED),
    "attnlab.normalizers.StickBreaking": (stickbreaking, *SCORED),
}
