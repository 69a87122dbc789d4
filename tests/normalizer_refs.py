"""Test helpers for the normalizers in jax.nn.dot_product_attention's (B,T,N,H) layout: the named mask settings,
operands, option variants and a token-major view of a normalizer, beside the float64 references, which live on each
normalizer class (its `reference` method) with their shared pieces in attnlab.normalizers.reference."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.config import registry
from attnlab.normalizers.exponential import kl_log_prior_np
from attnlab.normalizers.reference import (  # noqa: F401  re-exported for the tests
    POLY_FIT,
    adaptive_beta_np,
    admissible,
    core_stats,
    entmax_np,
    row_mean,
    rowwise,
    softmax_np,
)
from attnlab.normalizers.reference import output as reference_output
from attnlab.testing import MASK_SETTINGS
from attnlab.testing import normalizer as checker


def scores(q_BTNH, k_BSNH):
    """z = q·kᵀ in float64, (B,N,T,S), from token-major operands."""
    return np.einsum("btnh,bsnh->bnts", np.asarray(q_BTNH, np.float64), np.asarray(k_BSNH, np.float64))


def reference(norm, q_BTNH, k_BSNH, m_BTS):
    """(weights_BNTS, logits_BNTS, extras) of the normalizer's float64 `reference` on token-major operands."""
    inner = norm.inner if isinstance(norm, TokenMajor) else norm
    return inner.reference(*(np.swapaxes(np.asarray(x, np.float64), 1, 2) for x in (q_BTNH, k_BSNH)), m_BTS)


def output(norm, w_BNTS, v_BNSH):
    """The float64 output of reference weights (attnlab.normalizers.reference.output: w·v, or the normalizer's own
    `reference_output`), heads-major."""
    inner = norm.inner if isinstance(norm, TokenMajor) else norm
    return reference_output(inner, w_BNTS, v_BNSH)


def kl_log_prior(m_BTS, N, prior, slope=0.1, table_NK=None, max_distance=512):
    """KL's float64 log prior (exponential.kl_log_prior_np) with one slope for every head."""
    return kl_log_prior_np(m_BTS, N, prior, np.full(N, slope), table_NK, max_distance)


# ---------------------------------------------------------------------------------------------
# test cases shared by the test modules

B, N, H = checker.B, checker.N, checker.H


# Normalizers that refuse a bidirectional mask (class attribute `causal_only`): their reference cases run on the
# causal mask settings only.
def normalizer_class(name):
    """The class configs/normalizer/<name>.yaml builds."""
    return registry.resolve_target(registry.load("normalizer", name)["_target_"], "normalizer")


def variants(name):
    """{variant id: options} the tests check normalizer `name` under: its class's `check_variants`."""
    return {vid: dict(opts) for vid, opts in normalizer_class(name).check_variants.items()}


CAUSAL_ONLY = tuple(
    name for name in registry.choices("normalizer") if getattr(normalizer_class(name), "causal_only", False)
)


def cases():
    """[(name, variant_id, options)] over every normalizer the registry lists."""
    return [(name, vid, opts) for name in registry.choices("normalizer") for vid, opts in variants(name).items()]


def case_id(case):
    return f"{case[0]}-{case[1]}"


def mask_arrays(kind):
    """(T, S, key_valid_BS | None, dense_BTS | None, causal) of a named mask setting (attnlab.testing.MASK_SETTINGS,
    where each is described)."""
    s = MASK_SETTINGS[kind]
    return s.T, s.S, s.key_valid_BS, s.dense_BTS, s.causal


MASK_KINDS = ("none", "pad", "causal_pad", "causal_cross", "dense")
EMPTY_ROW_MASKS = ("causal_pad", "dense")


def qkv(seed, T, S, scale=1.0):
    rng = np.random.default_rng(seed)
    q = (scale * rng.normal(size=(B, T, N, H))).astype(np.float32)
    k = rng.normal(size=(B, S, N, H)).astype(np.float32)
    v = rng.normal(size=(B, S, N, H)).astype(np.float32)
    return q, k, v


def make_mask(kind):
    """(T, S, Mask, admissible (B,T,S) numpy bool) of a named mask setting."""
    T, S, valid, dense, causal = mask_arrays(kind)
    mask = nz.Mask(
        key_valid_BS=None if valid is None else jnp.asarray(valid),
        dense_BTS=None if dense is None else jnp.asarray(dense),
        causal=causal,
    )
    return T, S, mask, admissible(B, T, S, valid, dense, causal)


class TokenMajor(nnx.Module):
    """A normalizer seen in jax.nn.dot_product_attention's (B,T,N,H) layout, which these references
    use: transposes to the heads-major contract (B,N,T,H) and back; other attributes pass through."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        if name.startswith("_") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, q_BTNH, k_BSNH, v_BSNH, mask, **kwargs):
        out_BNTH, stats = self.inner(*(jnp.swapaxes(x, 1, 2) for x in (q_BTNH, k_BSNH, v_BSNH)), mask, **kwargs)
        return jnp.swapaxes(out_BNTH, 1, 2), stats

    def weights(self, q_BTNH, k_BSNH, mask):
        return self.inner.weights(jnp.swapaxes(q_BTNH, 1, 2), jnp.swapaxes(k_BSNH, 1, 2), mask)


def build(name, opts):
    """The named normalizer, called with (B,T,N,H) operands like the references (TokenMajor)."""
    return TokenMajor(config.normalizer(name, num_heads=N, head_dim=H, rngs=nnx.Rngs(0), **opts))
