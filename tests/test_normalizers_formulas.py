"""Every normalizer (discovered from configs/normalizer/) against its float64 numpy reference:
weights, output and statistics, under padding, causal, cross-causal and dense masks; jit = eager."""

import jax
import jax.numpy as jnp
import normalizer_refs as R
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.checks import ConfigError
from attnlab.config import registry
from attnlab.normalizers import sampled_rows

pytestmark = pytest.mark.numerics  # `make test-numerics` runs these on whatever accelerator JAX sees

CASES = R.cases()
ATOL, RTOL = 2e-5, 1e-4
_mask, _build = R.make_mask, R.build


def _reference(name, opts, q, k, m, module):
    if name not in R.REFS:
        pytest.fail(f"normalizer {name!r} has no numpy reference in tests/normalizer_refs.py REFS")
    return R.REFS[name][0](q, k, m, module, **R.options(name, **opts))


def _ref_params():
    out = []
    for case in CASES:
        for kind in R.MASK_KINDS:
            out.append(pytest.param(case, kind, id=f"{R.case_id(case)}-{kind}"))
    return out


def test_every_registered_normalizer_has_a_reference():
    names = registry.choices("normalizer")
    assert names, "no normalizer YAML found"
    missing = [n for n in names if n not in R.REFS]
    assert not missing, f"add numpy references (normalizer_refs.REFS) for {missing}"
    untested_variants = [n for n in names if n not in R.VARIANTS]
    assert not untested_variants, f"add option variants (normalizer_refs.VARIANTS) for {untested_variants}"
    for name, _, opts in CASES:  # every variant names real options
        _build(name, opts)


@pytest.mark.parametrize("case,kind", _ref_params())
def test_matches_reference(case, kind):
    name, _, opts = case
    T, S, mask, m = _mask(kind)
    q, k, v = R.qkv(7, T, S)
    norm = _build(name, opts)
    if name in R.CAUSAL_ONLY and not mask.causal:
        with pytest.raises(ConfigError, match="needs causal attention.*allowed: a causal mask"):
            norm(q, k, v, mask)
        with pytest.raises(ConfigError, match="needs causal attention"):
            norm.weights(q, k, mask)
        return
    w_ref, logits_ref, extras_ref = _reference(name, opts, q, k, m, norm)
    out_ref = np.einsum("bnts,bsnh->btnh", w_ref, v.astype(np.float64))

    w = np.asarray(norm.weights(q, k, mask))
    out, stats = norm(q, k, v, mask, with_stats=True)
    assert w.shape == (R.B, R.N, T, S) and out.shape == (R.B, T, R.N, R.H)
    np.testing.assert_allclose(w, w_ref, atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(np.asarray(out), out_ref, atol=ATOL, rtol=RTOL)

    # Contract: non-negative, exactly zero off the admissible set (padding, causal, empty rows).
    assert (w >= 0).all()
    assert (w[~np.broadcast_to(m[:, None], w.shape)] == 0).all()
    sums = w.sum(-1)
    has = np.broadcast_to(m.any(-1)[:, None], sums.shape)
    kind_sum = R.REFS[name][1]
    if kind_sum == "at_most_one" or "eps" in R.options(name, **opts):
        assert (sums[has] <= 1 + 1e-6).all()
    if kind_sum == "one" and "eps" in R.options(name, **opts):  # Σa/(Σa + eps) ≥ 1 − eps/min Σa
        eps, min_den = R.options(name, **opts)["eps"], extras_ref["min_denominator"]
        lower = 1 - eps / np.where(min_den > 0, min_den, np.nan)
        assert (np.nan_to_num(sums - lower[None, :, None], nan=1.0)[has] >= -1e-5).all()
    elif kind_sum == "one":
        np.testing.assert_allclose(sums[has], 1.0, atol=1e-5)

    # Statistics: the CORE_STATS keys plus the normalizer's extras, each (N,), all matching numpy.
    core_ref = R.core_stats(w_ref, logits_ref, m)
    assert set(stats) == set(nz.CORE_STATS) | set(extras_ref), sorted(stats)
    for key, ref in {**core_ref, **extras_ref}.items():
        assert stats[key].shape == (R.N,), key
        np.testing.assert_allclose(np.asarray(stats[key]), ref, atol=ATOL, rtol=RTOL, err_msg=key)


# One compiled program per case is costly: jit-check one variant per distinct code path.
JIT_CASES = [
    c
    for c in CASES
    if c[1] == next(iter(R.VARIANTS.get(c[0], {"default": {}})))
    or R.case_id(c)
    in ("kl-recency", "kl-learned", "entmax-alpha2", "entmax-alpha1.3", "linear-favor", "squared-offset")
]


@pytest.mark.parametrize("case", JIT_CASES, ids=R.case_id)
def test_jit_equals_eager(case):
    name, _, opts = case
    T, S, mask, _ = _mask("causal_pad" if opts.get("eps") != 0.0 else "grad")
    q, k, v = R.qkv(8, T, S)
    norm = _build(name, opts)
    out, stats = norm(q, k, v, mask, with_stats=True)
    w = norm.weights(q, k, mask)

    # a plain jax.jit over a pure function of (state, inputs); nnx.jit is checked on softmax below
    graphdef, state = nnx.split(norm)

    @jax.jit
    def pure(state, q, k, v, mask):
        mod = nnx.merge(graphdef, state)
        return mod(q, k, v, mask, with_stats=True), mod.weights(q, k, mask)

    (out_j, stats_j), w_j = pure(state, q, k, v, mask)
    tol = dict(atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(out_j), np.asarray(out), **tol)
    np.testing.assert_allclose(np.asarray(w_j), np.asarray(w), **tol)
    assert set(stats_j) == set(stats)
    for key in stats:
        np.testing.assert_allclose(np.asarray(stats_j[key]), np.asarray(stats[key]), err_msg=key, **tol)


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


def test_kl_learned_table_with_clipping_and_recency_per_head_slopes():
    """Priors away from their initial values: a random learned table (distances clipped at
    ±(max_distance−1)) and distinct per-head recency slopes, against the documented formulas."""
    T, S, mask, m = _mask("causal_cross")
    q, k, v = R.qkv(11, T, S)
    rng = np.random.default_rng(12)
    for M in (3, 20):
        norm = _build("kl", {"prior": "learned", "max_distance": M})
        table = rng.normal(size=(R.N, 2 * M - 1)).astype(np.float32)
        norm.table[...] = jnp.asarray(table)
        w_ref, _, ex = R.ref_kl(q, k, m, norm, table_NK=table, **R.options("kl", prior="learned", max_distance=M))
        np.testing.assert_allclose(np.asarray(norm.weights(q, k, mask)), w_ref, atol=ATOL, rtol=RTOL)
        stats = norm(q, k, v, mask, with_stats=True)[1]
        np.testing.assert_allclose(np.asarray(stats["kl_prior"]), ex["kl_prior"], atol=ATOL, rtol=RTOL)
    # non-causal too: negative distances use the other half of the table
    Tn, Sn, mask_n, m_n = _mask("pad")
    norm = _build("kl", {"prior": "learned", "max_distance": 6})
    table = rng.normal(size=(R.N, 11)).astype(np.float32)
    norm.table[...] = jnp.asarray(table)
    qn, kn, _ = R.qkv(13, Tn, Sn)
    w_ref = R.ref_kl(qn, kn, m_n, norm, table_NK=table, **R.options("kl", prior="learned", max_distance=6))[0]
    np.testing.assert_allclose(np.asarray(norm.weights(qn, kn, mask_n)), w_ref, atol=ATOL, rtol=RTOL)

    slopes = np.array([0.05, 0.5, 2.0])
    norm = _build("kl", {"prior": "recency"})
    norm.log_slope[...] = jnp.log(jnp.asarray(slopes, jnp.float32))
    w_ref = R.ref_kl(q, k, m, norm, **R.options("kl", prior="recency", slope=slopes))[0]
    np.testing.assert_allclose(np.asarray(norm.weights(q, k, mask)), w_ref, atol=ATOL, rtol=RTOL)


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
    for key, ref in R.core_stats(w_ref, logits, m).items():
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
        w_ref, logits_ref, _ = _reference(name, opts, q, k, m, norm)
        rows = sampled_rows.stats_rows(T)
        core_ref = R.core_stats(w_ref[:, :, rows], logits_ref[:, :, rows], m[:, rows])
        for key, ref in core_ref.items():
            np.testing.assert_allclose(np.asarray(stats[key]), ref, atol=ATOL, rtol=RTOL, err_msg=f"{name}: {key}")
    assert {"kl", "softmax", "ssmax"} <= set(found), found
