"""Gradients the normalizer contract checker (test_normalizer_checker) leaves out: softmax =
jax.nn.dot_product_attention forward and backward, the softmax Jacobian, the entmax function's own gradient
against float64 finite differences."""

import jax
import jax.numpy as jnp
import normalizer_refs as R
import numpy as np
import pytest
from jax.test_util import check_grads

from attnlab import normalizers as nz

pytestmark = pytest.mark.numerics  # `make test-numerics` runs these on whatever accelerator JAX sees

_mask, _build = R.make_mask, R.build


# --- softmax = jax.nn.dot_product_attention --------------------------------------------------


@pytest.mark.parametrize("kind", ["none", "pad", "causal_pad", "dense"])
def test_softmax_equals_dot_product_attention_forward_and_backward(kind):
    T, S, mask, m = _mask(kind)
    q, k, v = R.qkv(31, T, S)
    has = m.any(-1)  # (B, T): rows with at least one admissible key
    ct = jnp.asarray(np.random.default_rng(32).normal(size=(R.B, T, R.N, R.H)) * has[:, :, None, None], jnp.float32)
    norm = _build("softmax", {})

    def ours(q, k, v):
        return norm(q, k, v, mask)[0]

    def ref(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(m[:, None]), implementation="xla")

    outs = []
    for f in (ours, ref):
        out, vjp = jax.vjp(f, q, k, v)
        outs.append((np.asarray(out)[has], [np.asarray(g) for g in vjp(ct)]))
    np.testing.assert_allclose(outs[0][0], outs[1][0], atol=1e-6, rtol=1e-5)
    for g, g_ref, nm in zip(outs[0][1], outs[1][1], "qkv"):
        np.testing.assert_allclose(g, g_ref, atol=2e-6, rtol=1e-5, err_msg=f"d/d{nm}")


def test_softmax_jacobian_is_beta_diag_minus_outer():
    """Seed 003: ∂α/∂z = β(diag α − ααᵀ) for one row (z = q·k scores), with padding; by the chain
    rule ∂α/∂q = β(diag α − ααᵀ)K."""
    T, S, mask, m = _mask("pad")
    q, k, _ = R.qkv(33, T, S)
    beta = 0.8
    norm = _build("softmax", {"beta": beta})
    m_B1TS = mask.matrix_B1TS(T, S)
    z = R.scores(q, k).astype(np.float32)
    for b, n, t in [(0, 0, 0), (1, 2, 5)]:

        def row(zr, b=b, n=n, t=t):
            return norm.normalize(jnp.asarray(z).at[b, n, t].set(zr), m_B1TS)[0][b, n, t]

        alpha = np.asarray(row(z[b, n, t]), np.float64)
        expected = beta * (np.diag(alpha) - np.outer(alpha, alpha))
        J = np.asarray(jax.jacobian(row)(jnp.asarray(z[b, n, t])))
        np.testing.assert_allclose(J, expected, atol=1e-6)
        assert (J[~m[b, t]] == 0).all() and (J[:, ~m[b, t]] == 0).all()

        def row_q(qr, b=b, n=n, t=t):
            return norm.weights(jnp.asarray(q).at[b, t, n].set(qr), k, mask)[b, n, t]

        Jq = np.asarray(jax.jacobian(row_q)(jnp.asarray(q[b, t, n])))
        np.testing.assert_allclose(Jq, expected @ k[b, :, n].astype(np.float64), atol=1e-5)


# --- entmax gradients ------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3])
def test_entmax_gradient_matches_finite_differences(alpha):
    rng = np.random.default_rng(34)
    if alpha == 1.3:  # the bisection path (renormalised): its custom_jvp vs central differences in float64
        with jax.enable_x64(True):
            x = jnp.asarray(rng.normal(size=(3, 9)) * 2, jnp.float64)
            check_grads(lambda x: nz.entmax(x, alpha), (x,), order=1, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5)
    # through the module in float32: ∂(c·w)/∂z vs central differences of the numpy reference
    T, S, mask, m = _mask("pad")
    norm = _build("entmax", {"alpha": alpha, "beta": 1.5})
    z = (R.scores(*R.qkv(35, T, S)[:2])).astype(np.float32)
    c = rng.normal(size=z.shape).astype(np.float32)
    m_B1TS = mask.matrix_B1TS(T, S)
    g = np.asarray(jax.grad(lambda z: jnp.sum(norm.normalize(z, m_B1TS)[0] * c))(jnp.asarray(z)))
    h = 1e-6
    for b, n, t in [(0, 1, 3), (1, 0, 6)]:
        idx = np.flatnonzero(m[b, t])
        zr = 1.5 * z[b, n, t, idx].astype(np.float64)
        fd = np.array(
            [
                (c[b, n, t, idx] @ R.entmax_np(zr + h * e, alpha) - c[b, n, t, idx] @ R.entmax_np(zr - h * e, alpha))
                / (2 * h)
                * 1.5
                for e in np.eye(idx.size)
            ]
        )
        np.testing.assert_allclose(g[b, n, t, idx], fd, atol=1e-4, rtol=1e-3)
        assert (g[b, n, t, ~m[b, t]] == 0).all()
