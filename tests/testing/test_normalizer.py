"""The normalizer contract (attnlab.testing.check_normalizer) over every registered normalizer and option variant,
and the checker itself against deliberately broken normalizers."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from normalizer_refs import case_id, cases

from attnlab import config
from attnlab import normalizers as nz
from attnlab.config import registry
from attnlab.normalizers import reference as ref
from attnlab.testing import ContractViolation, check_normalizer

pytestmark = pytest.mark.numerics  # `make test-numerics` runs these on whatever accelerator JAX sees


def test_every_registered_normalizer_has_a_reference():
    names = registry.choices("normalizer")
    assert names, "no normalizer YAML found"
    built = {n: config.normalizer(n, num_heads=2, head_dim=4) for n in names}
    missing = [n for n, norm in built.items() if not callable(getattr(norm, "reference", None))]
    assert not missing, f"add a float64 `reference` method beside the implementation of {missing}"


# Each normalizer's first variant in the default suite; its option variants (whose formulas test_formulas checks
# against the references in the default suite too) under `long`.
FIRST = {name: variant for name, variant, _ in reversed(cases())}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[] if FIRST[c[0]] == c[1] else [pytest.mark.long]) for c in cases()],
    ids=case_id,
)
def test_shipped_normalizer_meets_the_contract(case):
    name, variant, opts = case
    check_normalizer(functools.partial(config.normalizer, name, **opts), name=f"{name} ({variant})")


# --- the checker names the property a broken normalizer breaks ------------------------------------------------------


class _Soft(nz.ScoreNormalizer):
    """softmax(βz) with every step through `normalize` (dense form only): the base of the broken normalizers below,
    each of which changes one thing."""

    def __init__(self, *, num_heads, head_dim, rngs, impl="auto"):
        self.beta = nz.InverseTemperature(num_heads, head_dim, None, True, True)
        self.set_impl(impl, None, head_dim)

    def logits(self, z_BNTS, m_B1TS):
        return self.beta()[None, :, None, None] * z_BNTS

    def normalize(self, z_BNTS, m_B1TS):
        x_BNTS = self.logits(z_BNTS, m_B1TS)
        return nz.masked_softmax(x_BNTS, m_B1TS), x_BNTS, {"beta": self.beta()}

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        beta_N = np.exp(np.asarray(self.beta.theta[...], np.float64))
        x_BNTS = beta_N[None, :, None, None] * ref.scores(q_BNTH, k_BNSH)
        return ref.tempered(x_BNTS, admissible_BTS, {"beta": beta_N}, "off")


class _UniformEmptyRows(_Soft):
    """A row with no admissible key weighs every key 1/S."""

    def normalize(self, z_BNTS, m_B1TS):
        w, x, extras = super().normalize(z_BNTS, m_B1TS)
        empty_B1T1 = ~m_B1TS.any(-1, keepdims=True)
        return jnp.where(empty_B1T1, 1.0 / z_BNTS.shape[-1], w), x, extras


class _NanGradientUnderMask(_Soft):
    """exp(log w): the right weights, but log 0 at a masked key makes its gradient 0·∞."""

    def normalize(self, z_BNTS, m_B1TS):
        w, x, extras = super().normalize(z_BNTS, m_B1TS)
        return jnp.where(m_B1TS, jnp.exp(jnp.log(w)), 0.0), x, extras


class _NumpyRandom(_Soft):
    """Jitter from numpy's global randomness: a new draw at every eager call."""

    def logits(self, z_BNTS, m_B1TS):
        jitter = 1e-3 * np.random.default_rng().normal(size=z_BNTS.shape)  # noqa: NPY002
        return super().logits(z_BNTS, m_B1TS) + jnp.asarray(jitter, z_BNTS.dtype)


class _CountsCalls(_Soft):
    """Keeps a count of its calls in an nnx variable, and sharpens with it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = nnx.Variable(jnp.zeros((), jnp.float32))

    def logits(self, z_BNTS, m_B1TS):
        self.calls[...] = self.calls[...] + 1
        return (1 + 0.01 * self.calls[...]) * super().logits(z_BNTS, m_B1TS)


class _CachesScale(_Soft):
    """Keeps, in a Python attribute, the largest |z| of the first call it sees, and scales by it ever after."""

    scale = None

    def logits(self, z_BNTS, m_B1TS):
        if self.scale is None:
            self.scale = float(jnp.abs(z_BNTS).max()) if not isinstance(z_BNTS, jax.core.Tracer) else 1.0
        return super().logits(z_BNTS, m_B1TS) / self.scale


class _NoMaxSubtracted(_Soft):
    """e^x / Σ e^x without the row's max taken off first: e^x overflows at large logits."""

    def normalize(self, z_BNTS, m_B1TS):
        x = self.logits(z_BNTS, m_B1TS)
        e = jnp.where(m_B1TS, jnp.exp(x), 0.0)
        total = e.sum(-1, keepdims=True)
        return e / jnp.where(total > 0, total, 1.0), x, {"beta": self.beta()}


class _StopGradientBeta(_Soft):
    """β behind a stray stop_gradient: it never learns."""

    def logits(self, z_BNTS, m_B1TS):
        return jax.lax.stop_gradient(self.beta())[None, :, None, None] * z_BNTS


class _SeesTheFuture(_Soft):
    """Logits scaled by the mean score of the keys the last query may see, later keys included: no weight on a
    masked key, but gradient from later keys."""

    def logits(self, z_BNTS, m_B1TS):
        last_B11S = m_B1TS[:, :, -1:, :]
        mean_BN11 = jnp.sum(jnp.where(last_B11S, z_BNTS, 0.0), (-2, -1), keepdims=True)
        mean_BN11 = mean_BN11 / jnp.maximum(jnp.sum(last_B11S, (-2, -1), keepdims=True), 1) / z_BNTS.shape[-2]
        return (1 + 0.1 * jnp.tanh(mean_BN11)) * super().logits(z_BNTS, m_B1TS)


class _IgnoresCausality(_Soft):
    """Attends to every key that is not padding, later ones included."""

    def weights(self, q_BNTH, k_BNSH, mask):
        return super().weights(q_BNTH, k_BNSH, mask.replace(causal=False))

    def __call__(self, q_BNTH, k_BNSH, v_BNSH, mask, **kwargs):
        return super().__call__(q_BNTH, k_BNSH, v_BNSH, mask.replace(causal=False), **kwargs)


class _WeightsOneKeyShort(_Soft):
    """`weights` drops the last key."""

    def weights(self, q_BNTH, k_BNSH, mask):
        return super().weights(q_BNTH, k_BNSH, mask)[..., :-1]


class _Float32Always(_Soft):
    """The output in float32 whatever the inputs' dtype."""

    def __call__(self, q_BNTH, k_BNSH, v_BNSH, mask, **kwargs):
        out, stats = super().__call__(q_BNTH, k_BNSH, v_BNSH, mask, **kwargs)
        return out.astype(jnp.float32), stats


class _NoMaxWeight(_Soft):
    """Statistics without max_weight."""

    def __call__(self, q_BNTH, k_BNSH, v_BNSH, mask, **kwargs):
        out, stats = super().__call__(q_BNTH, k_BNSH, v_BNSH, mask, **kwargs)
        return out, {key: value for key, value in stats.items() if key != "max_weight"}


class _LetsPaddingThrough(nz.Softmax):
    """Treats every key as admissible."""

    def normalize(self, z_BNTS, m_B1TS):
        return super().normalize(z_BNTS, jnp.ones_like(m_B1TS))


class _WrongReference(nz.Softmax):
    """A reference at 1.1 × the scores."""

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        return super().reference(1.1 * q_BNTH, k_BNSH, admissible_BTS)


@jax.custom_vjp
def _grad_times_1_5(x):
    return x


_grad_times_1_5.defvjp(lambda x: (x, None), lambda _, g: (1.5 * g,))


class _WrongGradient(nz.Softmax):
    """The right output, its gradient scaled by 1.5."""

    def dense_call(self, q_BNTH, k_BNSH, v_BNSH, mask):
        return _grad_times_1_5(super().dense_call(q_BNTH, k_BNSH, v_BNSH, mask))


class _BlockwiseOff(nz.ReLU):
    """A blockwise form with the wrong gate (its dense form is right)."""

    def block_form(self):
        form = super().block_form()
        return dataclasses.replace(form, gate=jax.nn.softplus)


class _ClaimsCausal(nz.ReLU):
    """Says it needs a causal mask but takes a bidirectional one."""

    causal_only = True


def test_the_base_of_the_broken_normalizers_meets_the_contract():
    check_normalizer(_Soft, name="soft")


SIZES = "at B=2 N=3 H=5 "


@pytest.mark.parametrize(
    "cls,prop,where",
    [
        (_UniformEmptyRows, "rows with no admissible key must be 0: weight 0.0769 in such a row", "mask=causal_pad"),
        (_NanGradientUnderMask, "finiteness: gradients must be finite: beta.theta", "T=7 S=11 mask=pad"),
        (_NumpyRandom, "determinism: the same call twice gives different bits (eagerly)", "mask=causal_pad"),
        (_CountsCalls, "determinism: a call changed the normalizer's calls", "mask=causal_pad"),
        (_CachesScale, "determinism: a call depends on the calls before it", "mask=causal_pad"),
        (_NoMaxSubtracted, "extremes: the output must stay finite at logits |βz| up to 10000 (float32)", "mask=grad"),
        (
            _StopGradientBeta,
            "every parameter gets a gradient: parameter beta.theta gets no gradient",
            "mask=grad (T=13 S=13)",
        ),
        (_SeesTheFuture, "causality: output row 3 gets gradient from later keys", "T=13 S=13 mask=grad"),
        (_IgnoresCausality, "causality: weight 0.", "later key, which the causal mask excludes at B=2 N=3 H=5 T=13"),
        (_WeightsOneKeyShort, "shapes: weights have shape (2, 3, 7, 10), expected (B,N,T,S)", "mask=none"),
        (_Float32Always, "shapes: plain step output is float32 (2, 3, 13, 5) for bfloat16 inputs", "dtype=bfloat16"),
        (_NoMaxWeight, "statistics keys: CORE_STATS ['max_weight'] missing", "T=7 S=11 mask=none"),
        (_LetsPaddingThrough, "padding keys must weigh 0: weight", "T=7 S=11 mask=pad"),
        (_WrongReference, "reference: weights:", "T=7 S=11 mask=none"),
        (_WrongGradient, "gradients against finite differences: d/dq along a random direction", "T=13 S=13 mask=grad"),
        (_BlockwiseOff, "impl=blockwise equal to its dense form: forward:", "mask=causal_pad_cross block=4"),
        (_ClaimsCausal, "refusal: a causal-only normalizer took a bidirectional mask", "mask=pad"),
    ],
    ids=lambda x: x.__name__ if isinstance(x, type) else None,
)
def test_the_checker_names_the_broken_property_and_where(cls, prop, where):
    with pytest.raises(ContractViolation) as info:
        check_normalizer(cls, name="broken")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"normalizer=broken: {prop}") and SIZES in msg and where in msg, msg
    assert isinstance(info.value, AssertionError)


class _NoReference(nz.ReLU):
    """ReLU without its float64 reference: gradients against finite differences of itself."""

    reference = None


def test_a_normalizer_without_reference_is_checked_against_its_own_finite_differences():
    check_normalizer(_NoReference, name="no-reference")
    with pytest.raises(
        ContractViolation,
        match=r"^normalizer=scaled: gradients against finite differences: d/dq .* the normalizer in float32",
    ):
        check_normalizer(type("Scaled", (_WrongGradient,), {"reference": None}), name="scaled")


def test_a_declared_statistic_without_a_float64_definition_is_refused_by_name(monkeypatch):
    """A core statistic added to attnlab.statistics (computed from the rows of every normalizer) with no float64
    definition in the reference fails the check, naming it: the comparison iterates the declared statistics."""
    from attnlab import statistics

    last = statistics.Statistic("last_weight", "weight on the last key", lambda rows: (rows.max_weight_BNR, None))
    monkeypatch.setattr(statistics, "STATISTICS", (*statistics.STATISTICS, last))
    monkeypatch.setattr(statistics, "CORE_STATS", (*statistics.CORE_STATS, last.name))
    with pytest.raises(ContractViolation) as info:
        check_normalizer(_Soft, name="soft")
    assert str(info.value).startswith(
        "normalizer=soft: reference: statistic attn_last_weight has no reference definition"
    ), info.value
