"""The normalizers proposed against softmax's dispersion at length: closed forms from their papers, parameters
away from their initial values against the float64 references, and gradients against finite differences."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import normalizer_refs as R

pytestmark = pytest.mark.numerics

ATOL, RTOL = 2e-5, 1e-4


def spike_row(n, pad=0):
    """Scores (1,1,1,n+pad) of n−1 keys at −2 and the last admissible one at +3, then `pad` padded keys,
    and its mask: the row of Nakanishi 2025, Figure 1."""
    z = np.full((1, 1, 1, n + pad), -2.0, np.float32)
    z[..., n - 1] = 3.0
    z[..., n:] = 50.0  # padded keys with a large score, which must get no weight
    m = np.zeros((1, 1, 1, n + pad), bool)
    m[..., :n] = True
    return jnp.asarray(z), jnp.asarray(m)


def max_weight(name, n, pad=0, **opts):
    norm = R.nz.build(name, num_heads=1, head_dim=4, beta=1.0, **opts)
    z, m = spike_row(n, pad)
    w = np.asarray(norm.normalize(z, m)[0])
    assert (w[..., n:] == 0).all()
    return float(w.max())


def test_softmax_disperses_and_ssmax_does_not_on_the_papers_row():
    """Nakanishi 2025 (Fig. 1): softmax's largest weight on −2s with one +3 is 1/(1 + (n−1)e⁻⁵): 0.94 at n = 10,
    0.13 at n = 1000; SSMax's is 1/(1 + (n−1)·n^{−5s}), ≈ 1 at n = 1000 for the paper's s = 0.43."""
    for n, printed in [(10, 0.94), (1000, 0.13)]:
        soft = max_weight("softmax", n, pad=3)
        assert soft == pytest.approx(1 / (1 + (n - 1) * math.exp(-5)), rel=1e-5)
        assert round(soft, 2) == printed
        ss = max_weight("ssmax", n, pad=3, s=0.43)
        assert ss == pytest.approx(1 / (1 + (n - 1) * n ** (-5 * 0.43)), rel=1e-5)
    assert max_weight("ssmax", 1000, s=0.43) > 0.999 > max_weight("ssmax", 10, s=0.43) > 0.93
    # s = 1/log n is plain softmax at that n
    assert max_weight("ssmax", 100, s=1 / math.log(100)) == pytest.approx(max_weight("softmax", 100), rel=1e-5)


def _set(module, **values):
    for name, value in values.items():
        getattr(module.inner, name)[...] = jnp.asarray(value, jnp.float32)


def test_ssmax_per_head_s_and_bias_match_the_reference():
    s, b = np.array([0.2, 0.9, 1.7]), np.array([0.3, -0.5, 0.1])
    for kind in ("causal_pad", "dense"):
        T, S, mask, m = R.make_mask(kind)
        q, k, v = R.qkv(41, T, S)
        norm = R.build("ssmax", {"bias": True})
        _set(norm, s=s, b=b)
        w_ref, _, extras = R.ref_ssmax(q, k, m, norm, **R.options("ssmax", bias=True, s=s, b=b))
        np.testing.assert_allclose(np.asarray(norm.weights(q, k, mask)), w_ref, atol=ATOL, rtol=RTOL)
        stats = norm(q, k, v, mask, with_stats=True)[1]
        for key in ("s", "bias", "beta"):
            np.testing.assert_allclose(np.asarray(stats[key]), extras[key], atol=ATOL, rtol=RTOL, err_msg=key)


def finite_difference(f, x, h=1e-6):
    """Central differences of a float64 scalar function f at x, one coordinate at a time."""
    x = np.asarray(x, np.float64)
    return np.array([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(x.size)]).reshape(x.shape)


def test_ssmax_gradients_match_finite_differences_of_the_reference():
    """d(Σ c·w)/dz per row and d/ds, d/db per head, against central differences of the float64 reference."""
    T, S, mask, m = R.make_mask("causal_pad")
    q, k, _ = R.qkv(42, T, S)
    s, b = np.array([0.5, 1.1, 0.3]), np.array([0.2, -0.1, 0.4])
    norm = R.build("ssmax", {"bias": True, "beta": 0.7})
    _set(norm, s=s, b=b)
    z = R.scores(q, k).astype(np.float32)
    c = np.random.default_rng(43).normal(size=z.shape)
    m_B1TS = mask.matrix_B1TS(T, S)

    graphdef, params, rest = nnx.split(norm.inner, R.nz.NormalizerParam, ...)

    def loss(z, params):
        return jnp.sum(nnx.merge(graphdef, params, rest).normalize(z, m_B1TS)[0] * c)

    gz, gp = jax.grad(loss, (0, 1))(jnp.asarray(z), params)
    gs, gb = gp["s"][...], gp["b"][...]

    def ref_loss(z=z, s=s, b=b):
        w = R.rowwise(lambda r, bb, n, t, idx: R.softmax_np(0.7 * (s[n] * math.log(idx.size) + b[n]) * r), z, m)
        return float(np.sum(w * c))

    np.testing.assert_allclose(np.asarray(gs), finite_difference(lambda s: ref_loss(s=s), s), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gb), finite_difference(lambda b: ref_loss(b=b), b), rtol=1e-3, atol=1e-4)
    for bb, n, t in [(0, 1, 5), (1, 2, 12)]:
        def row_loss(r, bb=bb, n=n, t=t):
            zz = z.astype(np.float64).copy()
            zz[bb, n, t] = r
            return ref_loss(z=zz)

        np.testing.assert_allclose(np.asarray(gz)[bb, n, t], finite_difference(row_loss, z[bb, n, t]),
                                   rtol=1e-3, atol=1e-4)
