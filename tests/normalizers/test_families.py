"""Normalizer-specific facts: the KL view, temperature limits, squared attention's scale
(in)variance and its eps, linear attention's four forms, entmax limits, softmax₁, sigmoid bias,
option validation."""

import warnings

import jax
import jax.numpy as jnp
import normalizer_refs as R
import numpy as np
import pytest

from attnlab import config
from attnlab import normalizers as nz
from attnlab.config import registry

_mask, _build = R.make_mask, R.build


# --- KL-regularised attention: softmax(βz + log u) -------------------------------------------


@pytest.mark.parametrize("kind", R.MASK_KINDS)
def test_kl_with_uniform_prior_equals_softmax(kind):
    T, S, mask, _ = _mask(kind)
    q, k, v = R.qkv(41, T, S)
    for beta in (None, 2.5):
        kl, sm = _build("kl", {"prior": "uniform", "beta": beta}), _build("softmax", {"beta": beta})
        np.testing.assert_allclose(np.asarray(kl.weights(q, k, mask)), np.asarray(sm.weights(q, k, mask)), atol=1e-6)
        np.testing.assert_allclose(np.asarray(kl(q, k, v, mask)[0]), np.asarray(sm(q, k, v, mask)[0]), atol=1e-6)


def test_kl_by_default_is_an_ablation_of_softmax_with_the_recency_prior():
    """The YAML default and the constructor's agree on recency, whose weights are not softmax's."""
    T, S, mask, _ = _mask("causal_pad")
    q, k, _ = R.qkv(41, T, S)
    default, recency = _build("kl", {}), _build("kl", {"prior": "recency"})
    assert default.inner.prior == "recency" and nz.KL(num_heads=1, head_dim=4, rngs=None).prior == "recency"
    w = np.asarray(default.weights(q, k, mask))
    np.testing.assert_array_equal(w, np.asarray(recency.weights(q, k, mask)))
    assert np.abs(w - np.asarray(_build("softmax", {}).weights(q, k, mask))).max() > 1e-2


def _objective(p, z, logu, beta):
    """⟨π,z⟩ − (1/β)·KL(π‖u) in float64."""
    nzp = p > 0
    return p @ z - np.sum(p[nzp] * (np.log(p[nzp]) - logu[nzp])) / beta


@pytest.mark.parametrize("prior", ["uniform", "recency"])
def test_kl_closed_form_maximises_the_regularised_objective(prior):
    """A numpy mirror-ascent solver of max_π ⟨π,z⟩ − (1/β)KL(π‖u) on the simplex reaches the
    closed form; random feasible perturbations of it lower the objective."""
    T, S, mask, m = _mask("causal_cross")
    q, k, _ = R.qkv(42, T, S)
    beta = 0.9
    norm = _build("kl", {"prior": prior, "beta": beta, "slope": 0.4})
    w = np.asarray(norm.weights(q, k, mask), np.float64)
    logu_all = R.kl_log_prior(m, R.N, prior, 0.4)
    z_all = R.scores(q, k)
    rng = np.random.default_rng(43)
    for b, n, t in [(0, 0, 6), (1, 2, 2), (0, 1, 0)]:
        idx = np.flatnonzero(m[b, t])
        z, logu, p_star = z_all[b, n, t, idx], logu_all[b, n, t, idx], w[b, n, t, idx]
        # exponentiated-gradient (mirror) ascent from the uniform point
        p = np.full(idx.size, 1.0 / idx.size)
        eta = 0.5 * beta
        for _ in range(300):
            grad = z - (np.log(p) - logu + 1) / beta
            p = p * np.exp(eta * (grad - grad.max()))
            p /= p.sum()
        np.testing.assert_allclose(p, p_star, atol=1e-5)
        best = _objective(p_star, z, logu, beta)
        for _ in range(50):
            d = rng.normal(size=idx.size)
            d -= d.mean()
            step = 0.5 * np.min(p_star / np.maximum(np.abs(d), 1e-12))
            p2 = np.clip(p_star + step * d, 0, None)
            p2 /= p2.sum()
            assert _objective(p2, z, logu, beta) < best
        # the reported objective is that optimum's value (LSE/β)
        lse = np.logaddexp.reduce(beta * z + logu)
        np.testing.assert_allclose(best, lse / beta, rtol=1e-5)


# --- temperature limits --------------------------------------------------------------------

ARGMAX_CASES = [
    ("softmax", {}),
    ("kl", {"prior": "uniform"}),
    ("kl", {"prior": "recency"}),
    ("entmax", {"alpha": 1.5}),
    ("entmax", {"alpha": 2.0}),
    ("entmax", {"alpha": 1.3}),
]


@pytest.mark.parametrize("name,opts", ARGMAX_CASES, ids=lambda x: str(x))
def test_large_beta_is_argmax_and_small_beta_is_uniform(name, opts):
    T, S, mask, m = _mask("causal_pad")
    q, k, _ = R.qkv(44, T, S)
    z = R.scores(q, k)
    zs = np.sort(np.where(m[:, None], z, -1e9), -1)
    has = m.any(-1)[:, None] & (zs[..., -1] - zs[..., -2] > 0.02)  # a clear argmax (or one key)
    assert has.sum() > 50
    hot = np.zeros_like(z)
    arg = np.argmax(np.where(m[:, None], z, -np.inf), -1)
    np.put_along_axis(hot, arg[..., None], 1.0, -1)
    w_hi = np.asarray(_build(name, {**opts, "beta": 1e3}).weights(q, k, mask))
    np.testing.assert_allclose(w_hi[has], hot[has], atol=1e-5)
    w_lo = np.asarray(_build(name, {**opts, "beta": 1e-6}).weights(q, k, mask))
    if opts.get("prior") == "recency":  # β → 0 leaves the prior u (the YAML's slope, 0.1)
        expected = np.exp(R.kl_log_prior(m, R.N, "recency", 0.1))
    else:
        expected = np.broadcast_to((m / np.maximum(m.sum(-1, keepdims=True), 1))[:, None], z.shape)
    np.testing.assert_allclose(w_lo, expected, atol=1e-5)


# --- squared attention (Qin et al. 2022) ------------------------------------------------------


def test_squared_is_beta_invariant_without_offset_and_not_with_it():
    T, S, mask, _ = _mask("pad")
    q, k, _ = R.qkv(45, T, S)
    for power in (2, 3):
        w = [
            np.asarray(_build("squared", {"beta": b, "eps": 0.0, "power": power}).weights(q, k, mask))
            for b in (0.3, 4.0)
        ]
        np.testing.assert_allclose(w[0], w[1], atol=1e-6)
    w = [np.asarray(_build("squared", {"beta": b, "offset": True}).weights(q, k, mask)) for b in (0.3, 4.0)]
    assert np.abs(w[0] - w[1]).max() > 0.05
    # sign-blind without offset: z and −z weigh the same
    w_pos = np.asarray(_build("squared", {}).weights(q, k, mask))
    np.testing.assert_allclose(np.asarray(_build("squared", {}).weights(-q, k, mask)), w_pos, atol=1e-7)


def test_squared_zero_logit_row_is_nan_with_eps0_and_zero_with_eps():
    """Pinned instability: a row whose logits are all 0 has denominator 0. With eps = 0 it is 0/0
    (NaN, on purpose: the instability Qin et al. 2022 describe); with eps > 0 its weights are 0 and gradients finite."""
    T, S, mask, _ = _mask("pad")
    q, k, v = R.qkv(46, T, S)
    q[0, 3] = 0.0  # row (b=0, t=3): every logit is 0
    w0 = np.array(_build("squared", {"eps": 0.0}).weights(q, k, mask))
    assert np.isnan(w0[0, :, 3]).all()
    w0[0, :, 3] = 0
    assert np.isfinite(w0).all()
    norm = _build("squared", {"eps": 1e-6})
    w = np.asarray(norm.weights(q, k, mask))
    assert np.isfinite(w).all() and (w[0, :, 3] == 0).all()
    out, stats = norm(q, k, v, mask, with_stats=True)
    assert float(stats["min_denominator"].min()) == 0.0
    g = jax.grad(lambda q: norm(q, k, v, mask)[0].sum())(jnp.asarray(q))
    assert np.isfinite(np.asarray(g)).all()


# --- linear attention: three forms ------------------------------------------------------------


@pytest.mark.parametrize("feature_map", ["elu1", "relu", "favor"])
def test_linear_attention_forms_agree(feature_map):
    """Parallel (dense mask), chunked causal (chunk sizes dividing T or not) and bidirectional agree, with key
    padding."""
    T, S, mask_c, m = _mask("causal_pad")
    valid = mask_c.key_valid_BS
    q, k, v = R.qkv(47, T, S)
    opts = {"feature_map": feature_map, "num_features": 16}
    ref = np.einsum("bnts,bsnh->btnh", R.reference(_build("linear", opts), q, k, m)[0], v)
    tol = dict(atol=1e-5, rtol=1e-5)

    norm = _build("linear", opts)
    causal_dense = jnp.broadcast_to(jnp.tril(jnp.ones((T, S), bool)), (R.B, T, S))
    parallel = np.asarray(norm(q, k, v, nz.Mask(key_valid_BS=valid, dense_BTS=causal_dense))[0])
    np.testing.assert_allclose(parallel, ref, **tol)
    for chunk in (1, 4, 13, 64):  # 4 does not divide T = 13; 64 > T
        out = _build("linear", {**opts, "chunk_size": chunk})(q, k, v, mask_c)[0]
        np.testing.assert_allclose(np.asarray(out), parallel, err_msg=f"chunk_size={chunk}", **tol)

    mask_b = nz.Mask(key_valid_BS=valid)
    bidir = np.asarray(norm(q, k, v, mask_b)[0])
    dense_all = nz.Mask(key_valid_BS=valid, dense_BTS=jnp.ones((R.B, T, S), bool))
    np.testing.assert_allclose(bidir, np.asarray(norm(q, k, v, dense_all)[0]), **tol)
    np.testing.assert_allclose(bidir, np.einsum("bnts,bsnh->btnh", np.asarray(norm.weights(q, k, mask_b)), v), **tol)


def test_favor_features_approximate_softmax_attention():
    """With many random features FAVOR+ approximates softmax(q·k/√H) (loosely: Monte Carlo)."""
    T, S, mask, _ = _mask("pad")
    q, k, _ = R.qkv(48, T, S)
    q, k = 0.5 * q, 0.5 * k
    w = np.asarray(_build("linear", {"feature_map": "favor", "num_features": 1024}).weights(q, k, mask))
    w_sm = np.asarray(_build("softmax", {}).weights(q, k, mask))
    assert np.abs(w - w_sm).max() < 0.05
    w_few = np.asarray(_build("linear", {"feature_map": "favor", "num_features": 5}).weights(q, k, mask))
    assert np.abs(w - w_sm).mean() < np.abs(w_few - w_sm).mean()


def test_elu1_features_keep_precision_far_below_zero():
    """φ(x) = exp(x) for x < 0, not elu(x) + 1, which rounds to 0 below x ≈ −17 in float32 (fla #1261)."""
    T, S, mask, m = _mask("pad")
    q, k, v = R.qkv(54, T, S)
    k = (-20 - 5 * np.abs(k)).astype(np.float32)
    norm = _build("linear", {"eps": 0.0})
    w_ref = R.reference(norm, q, k, m)[0]
    np.testing.assert_allclose(np.asarray(norm.weights(q, k, mask)), w_ref, rtol=1e-4, atol=1e-6)
    g = jax.grad(lambda k: norm(q, k, v, mask)[0].sum())(jnp.asarray(k))
    assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).sum() > 0


def test_linear_eps0_rows_without_admissible_keys_are_zero():
    T, S, mask, m = _mask("causal_pad")
    q, k, v = R.qkv(49, T, S)
    out = np.asarray(_build("linear", {"eps": 0.0})(q, k, v, mask)[0])
    assert (out[~m.any(-1)] == 0).all()


def test_causal_flag_is_honoured_with_a_mask_object():
    T, S, mask, _ = _mask("grad")
    q, k, v = R.qkv(53, T, S)
    padding_only = nz.Mask(key_valid_BS=mask.key_valid_BS)
    np.testing.assert_allclose(
        np.asarray(config.attention_weights("softmax", q, k, padding_only, causal=True)),
        np.asarray(config.attention_weights("softmax", q, k, mask)),
        atol=1e-6,
    )


# --- entmax, softmax₁, sigmoid --------------------------------------------------------------


def test_entmax_approaches_softmax_as_alpha_goes_to_one():
    T, S, mask, _ = _mask("causal_pad")
    q, k, _ = R.qkv(50, T, S)
    w_sm = np.asarray(_build("softmax", {}).weights(q, k, mask))
    errs = [
        np.abs(np.asarray(_build("entmax", {"alpha": a}).weights(q, k, mask)) - w_sm).max() for a in (1.3, 1.05, 1.001)
    ]
    assert errs[2] < 2e-3 and errs[2] < errs[1] < errs[0]


def test_softmax1_stable_form_equals_naive_and_is_a_null_sink():
    T, S, mask, m = _mask("pad")
    q, k, _ = R.qkv(51, T, S)
    k[1], q[1, :3], q[1, 3:] = np.abs(k[1]), -np.abs(q[1, :3]), np.abs(q[1, 3:])  # rows all < 0 / all > 0
    norm = _build("softmax1", {})
    x = jnp.asarray(norm.beta()[None, :, None, None] * R.scores(q, k), jnp.float32)
    e = jnp.where(jnp.asarray(m[:, None]), jnp.exp(x), 0.0)
    naive = e / (1 + e.sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(norm.weights(q, k, mask)), np.asarray(naive), atol=1e-6)
    # logits ±1e4: all-negative rows give ~0 (the sink takes everything), a positive row ~one-hot
    big = _build("softmax1", {"beta": 1e4})
    w = np.asarray(big.weights(q, k, mask))
    assert np.isfinite(w).all()
    z = np.where(m[:, None], R.scores(q, k), -np.inf)
    top = z.max(-1)
    assert (top > 1e-2).any() and (top < -1e-2).any()
    np.testing.assert_allclose(w.sum(-1)[top > 1e-2], 1.0, atol=1e-6)
    np.testing.assert_allclose(w.sum(-1)[top < -1e-2], 0.0, atol=1e-6)


@pytest.mark.parametrize("kind", ["causal_pad", "dense"])
def test_sigmoid_default_bias_is_minus_log_n(kind):
    """At zero logits σ(−log n) = 1/(n+1) per admissible key, so a row sums to n/(n+1)."""
    T, S, mask, m = _mask(kind)
    q, k, _ = R.qkv(52, T, S, scale=0.0)
    n = m.sum(-1)
    w = np.asarray(_build("sigmoid", {}).weights(q, k, mask))
    expected = np.where(m, 1.0 / (n[..., None] + 1), 0.0)[:, None]
    np.testing.assert_allclose(w, np.broadcast_to(expected, w.shape), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w.sum(-1), np.broadcast_to((n / (n + 1))[:, None], w.shape[:3]), rtol=1e-6)
    w_b = np.asarray(_build("sigmoid", {"bias": -2.0}).weights(q, k, mask))
    expected_b = np.where(m[:, None], 1 / (1 + np.exp(2.0)), 0.0)
    np.testing.assert_allclose(w_b, np.broadcast_to(expected_b, w.shape), rtol=1e-6)


# --- option validation ---------------------------------------------------------------------


def test_unknown_name_or_option_lists_what_exists():
    q = jnp.zeros((1, 2, R.N, R.H))
    names = registry.choices("normalizer")
    for call in (
        lambda: config.attend("nonexistent", q, q, q),
        lambda: config.normalizer("nonexistent", num_heads=R.N, head_dim=R.H),
        lambda: config.attention_weights("nonexistent", q, q),
    ):
        with pytest.raises(ValueError) as err:
            call()
        assert all(n in str(err.value) for n in names), str(err.value)
    for name in names:
        with pytest.raises(ValueError, match="bogus_option") as err:
            config.attend(name, q, q, q, bogus_option=1)
        allowed = [k for k in registry.load("normalizer", name) if not k.startswith("_")]
        assert all(a in str(err.value) for a in allowed), str(err.value)


@pytest.mark.parametrize(
    "name,opts,option",
    [
        ("entmax", {"alpha": 1.0}, "alpha"),
        ("entmax", {"alpha": 0.5}, "alpha"),
        ("squared", {"eps": -1e-3}, "eps"),
        ("squared", {"power": 0}, "power"),
        ("squared", {"power": 2.5}, "power"),
        ("squared", {"offset": True, "power": 3}, "offset"),
        ("linear", {"feature_map": "softplus"}, "feature_map"),
        ("linear", {"eps": -1.0}, "eps"),
        ("kl", {"prior": "gaussian"}, "prior"),
        ("kl", {"prior": "recency", "slope": 0.0}, "slope"),
        ("softmax", {"beta": 0.0}, "beta"),
        ("softmax", {"beta": -1.0}, "beta"),
    ],
)
def test_invalid_option_values_name_the_option(name, opts, option):
    with pytest.raises(ValueError, match=option):
        _build(name, opts)


def test_learnable_beta_without_offset_warns():
    with pytest.warns(UserWarning, match="scale-invariant"):
        _build("squared", {"learnable": True, "offset": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _build("squared", {"learnable": True, "offset": True})
        _build("squared", {"learnable": False, "offset": False})
