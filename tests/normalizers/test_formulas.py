"""What the normalizer contract checker (test_normalizer_checker) leaves out: nnx.jit, the public attend /
attention_weights helpers, the statistics' own definitions and the sampled-row statistics."""

import jax.numpy as jnp
import normalizer_refs as R
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.backends import sampled_rows
from attnlab.checks import ConfigError
from attnlab.config import registry

pytestmark = pytest.mark.numerics  # `make test-numerics` runs these on whatever accelerator JAX sees

CASES = R.cases()
ATOL, RTOL = 2e-5, 1e-4
_mask, _build = R.make_mask, R.build


def test_nnx_jit_equals_eager():
    T, S, mask, _ = _mask("causal_pad")
    q, k, v = R.qkv(8, T, S)
    norm = _build("softmax", {})
    out_j = nnx.jit(lambda mod, q, k, v, mask: mod(q, k, v, mask)[0])(norm, q, k, v, mask)
    np.testing.assert_allclose(np.asarray(out_j), np.asarray(norm(q, k, v, mask)[0]), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", registry.choices("normalizer"))
def test_attend_and_attention_weights_helpers(name):
    """The public helpers build from the YAML defaults; a boolean (B,T,S) array is a dense mask."""
    T, S, _, m = _mask("dense")
    q, k, v = R.qkv(9, T, S)
    dense = jnp.asarray(m)
    norm = _build(name, {})
    causal = name in R.CAUSAL_ONLY
    if causal:  # a bidirectional mask is refused; a causal dense one is taken
        with pytest.raises(ConfigError, match="needs causal attention"):
            config.attend(name, q, k, v, dense)
        dense = dense & jnp.asarray(R.admissible(R.B, T, S, causal=True))
    out, stats = config.attend(name, q, k, v, dense, causal=causal)
    w = config.attention_weights(name, q, k, dense, causal=causal)
    mask = nz.Mask(dense_BTS=dense, causal=causal)
    np.testing.assert_allclose(np.asarray(out), np.asarray(norm(q, k, v, mask)[0]), atol=1e-6)
    np.testing.assert_allclose(np.asarray(w), np.asarray(norm.weights(q, k, mask)), atol=1e-6)
    assert set(nz.CORE_STATS) <= set(stats)
    assert config.attend(name, q, k, v, dense, causal=causal, with_stats=False)[1] == {}
    # causal=True via the helper equals an explicit causal Mask
    Tc, Sc, _, _ = _mask("causal_cross")
    qc, kc, vc = R.qkv(10, Tc, Sc)
    out_c, _ = config.attend(name, qc, kc, vc, causal=True)
    np.testing.assert_allclose(np.asarray(out_c), np.asarray(norm(qc, kc, vc, nz.Mask(causal=True))[0]), atol=1e-6)


def test_entropy_stat_uniform_is_one_and_one_hot_is_zero():
    T, S, mask, m = _mask("causal_pad")
    m_B1TS = jnp.asarray(m[:, None])
    n = m.sum(-1, keepdims=True)
    uniform = np.where(m, 1.0 / np.maximum(n, 1), 0.0)[:, None].repeat(R.N, 1)
    logits = np.zeros_like(uniform)
    s = nz.core_stats(jnp.asarray(uniform, jnp.float32), jnp.asarray(logits, jnp.float32), m_B1TS)
    np.testing.assert_allclose(np.asarray(s["entropy"]), 1.0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(s["row_mass"]), 1.0, atol=1e-6)
    first = np.argmax(m, -1)  # one-hot on the first admissible key
    one_hot = np.zeros_like(uniform)
    for b, t in np.ndindex(m.shape[:2]):
        if m[b, t].any():
            one_hot[b, :, t, first[b, t]] = 1.0
    s = nz.core_stats(jnp.asarray(one_hot, jnp.float32), jnp.asarray(logits, jnp.float32), m_B1TS)
    np.testing.assert_allclose(np.asarray(s["entropy"]), 0.0, atol=1e-7)
    np.testing.assert_allclose(np.asarray(s["max_weight"]), 1.0, atol=1e-7)
    # softmax of zero logits is uniform over the admissible keys: entropy 1 through a normalizer
    q, k, v = R.qkv(14, T, S, scale=0.0)
    stats = _build("softmax", {})(q, k, v, mask, with_stats=True)[1]
    np.testing.assert_allclose(np.asarray(stats["entropy"]), 1.0, atol=1e-6)


@pytest.mark.parametrize("kind", R.MASK_KINDS)
@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_softmax_stats_from_logits_match_the_statistics_of_the_weights(kind, scale):
    """softmax_stats reads only the logits; the float64 reference builds the weights and applies the definitions
    (empty rows, one-key rows, and logits large enough to overflow an unshifted exp included)."""
    T, S, _, m = _mask(kind)
    x = scale * np.random.default_rng(7).normal(size=(R.B, R.N, T, S))
    logits = 0.5 * x
    w_ref = R.rowwise(lambda r, *_: R.softmax_np(r), x, m)
    got = nz.softmax_stats(jnp.asarray(x, jnp.float32), jnp.asarray(logits, jnp.float32), jnp.asarray(m[:, None]))
    for key, ref in R.checker.reference_statistics(w_ref, logits, m, {}).items():
        np.testing.assert_allclose(np.asarray(got[key]), ref, atol=ATOL, rtol=RTOL, err_msg=key)


def test_sampled_row_statistics_of_row_softmax_normalizers_match_the_reference(monkeypatch):
    """Every normalizer with a row-softmax form (found, not listed) reports on sampled rows the float64
    reference's statistics of its weights on those rows (adaptive temperature, which changes the weights at
    evaluation only, takes the dense form there: not these rows)."""
    monkeypatch.setattr(sampled_rows, "STATS_ROWS", 5)
    found = []
    for name, _, opts in CASES:
        T, S, mask, m = _mask("causal_pad")
        norm = _build(name, opts).inner
        z_BNTS = jnp.zeros((R.B, R.N, T, S))
        if not isinstance(norm, nz.ScoreNormalizer) or norm.mode_dependent:
            continue
        if norm.softmax_rows(z_BNTS, mask.matrix_B1TS(T, S), None) is None:
            continue
        found.append(name)
        q, k, _ = R.qkv(3, T, S)
        stats = norm._row_stats(*(jnp.swapaxes(jnp.asarray(a), 1, 2) for a in (q, k)), mask)
        w_ref, logits_ref, _ = R.reference(norm, q, k, m)
        rows = sampled_rows.stats_rows(T)
        core_ref = R.checker.reference_statistics(w_ref[:, :, rows], logits_ref[:, :, rows], m[:, rows], {}, rows)
        for key, ref in core_ref.items():
            np.testing.assert_allclose(np.asarray(stats[key]), ref, atol=ATOL, rtol=RTOL, err_msg=f"{name}: {key}")
    assert {"kl", "softmax", "ssmax"} <= set(found), found
