"""The normalizer contract (attnlab.testing.check_normalizer) over every registered normalizer and option variant,
and the checker itself against deliberately broken normalizers."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest
from normalizer_refs import case_id, cases

from attnlab import config
from attnlab import normalizers as nz
from attnlab.config import registry
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


# --- the checker catches broken normalizers -------------------------------------------------------------------------


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


@pytest.mark.parametrize(
    "cls,prop,where",
    [
        (_LetsPaddingThrough, "padding keys must weigh 0: weight", "at B=2 N=3 H=5 T=7 S=11 mask=pad"),
        (_WrongReference, "reference: weights:", "at B=2 N=3 H=5 T=7 S=11 mask=none"),
        (_WrongGradient, "gradient: d/dq along a random direction", "at B=2 N=3 H=5 T=13 S=13 mask=grad"),
        (_BlockwiseOff, "impl=blockwise equal to its dense form: forward:", "mask=causal_pad_cross block=4"),
        (_ClaimsCausal, "refusal: a causal-only normalizer took a bidirectional mask", "mask=pad"),
    ],
    ids=lambda x: x.__name__ if isinstance(x, type) else None,
)
def test_the_checker_names_the_broken_property_and_where(cls, prop, where):
    with pytest.raises(ContractViolation) as info:
        check_normalizer(cls, name="broken")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"normalizer=broken: {prop}") and where in msg, msg
    assert isinstance(info.value, AssertionError)


class _NoReference(nz.ReLU):
    """ReLU without its float64 reference: gradients against finite differences of itself."""

    reference = None


def test_a_normalizer_without_reference_is_checked_against_its_own_finite_differences():
    check_normalizer(_NoReference, name="no-reference")
    with pytest.raises(ContractViolation, match=r"^normalizer=scaled: gradient: d/dq .* the normalizer in float32"):
        check_normalizer(type("Scaled", (_WrongGradient,), {"reference": None}), name="scaled")
