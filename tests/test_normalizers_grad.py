"""Gradients: causality and padding (exact zeros), finiteness at logits of ±1e4 in float32 and
bfloat16, softmax = jax.nn.dot_product_attention forward and backward, the softmax Jacobian,
entmax gradients against finite differences."""

import jax
import jax.numpy as jnp
import normalizer_refs as R
import numpy as np
import pytest
from jax.test_util import check_grads

from attnlab import normalizers as nz

pytestmark = pytest.mark.numerics  # `make test-numerics` runs these on whatever accelerator JAX sees

CASES = R.cases()
_mask, _build = R.make_mask, R.build


ROWS = (0, 3, 4, 9, 12)  # first row, chunk boundaries of chunk_size=4, mid-chunk, last (partial) chunk


@pytest.mark.parametrize("case", CASES, ids=R.case_id)
def test_causal_and_padding_gradients_are_exactly_zero(case):
    """Output row t has no gradient from keys/values after t, from queries other than t, or from
    padded keys; and changing padded keys/values leaves outputs and weights bit-identical."""
    name, _, opts = case
    T, S, mask, m = _mask("grad")
    valid = np.asarray(mask.key_valid_BS)
    q, k, v = R.qkv(21, T, S)
    norm = _build(name, opts)
    out, vjp = jax.vjp(lambda q, k, v: norm(q, k, v, mask)[0], q, k, v)
    ct = np.random.default_rng(20).normal(size=out.shape).astype(np.float32)
    attends = R.REFS[name][0](q, k, m, norm, **R.options(name, **opts))[0] > 0  # the reference's nonzero weights
    for t in ROWS:
        ct_t = np.zeros_like(ct)
        ct_t[:, t] = ct[:, t]
        gq, gk, gv = (np.asarray(g) for g in vjp(jnp.asarray(ct_t)))
        assert (gk[:, t + 1 :] == 0).all() and (gv[:, t + 1 :] == 0).all(), f"row {t} sees the future"
        assert (np.delete(gq, t, axis=1) == 0).all(), f"row {t} depends on other queries"
        if attends[:, :, t].any():  # stick-breaking's first row takes no key (without attend_current)
            assert np.abs(gv[:, : t + 1]).sum() > 0
    gq, gk, gv = (np.asarray(g) for g in vjp(jnp.asarray(ct)))
    assert (gk[~valid] == 0).all() and (gv[~valid] == 0).all(), "padded keys receive gradient"
    assert all(np.isfinite(g).all() for g in (gq, gk, gv))
    assert np.abs(gq).sum() > 0 and np.abs(gk).sum() > 0

    rng = np.random.default_rng(22)
    k2, v2 = k.copy(), v.copy()
    k2[~valid] = 10 * rng.normal(size=k2[~valid].shape)
    v2[~valid] = 10 * rng.normal(size=v2[~valid].shape)
    np.testing.assert_array_equal(np.asarray(norm(q, k2, v2, mask)[0]), np.asarray(norm(q, k, v, mask)[0]))
    np.testing.assert_array_equal(np.asarray(norm.weights(q, k2, mask)), np.asarray(norm.weights(q, k, mask)))


def _empty_row_params():
    return [pytest.param(c, id=R.case_id(c)) for c in CASES]


@pytest.mark.parametrize("case", _empty_row_params())
def test_rows_without_admissible_keys_are_zero_with_finite_gradients(case):
    name, _, opts = case
    T, S, mask, m = _mask("causal_pad")
    q, k, v = R.qkv(23, T, S)
    norm = _build(name, opts)
    empty = ~m.any(-1)  # (B, T)
    assert empty.any()
    out, stats = norm(q, k, v, mask, with_stats=True)
    assert (np.asarray(out)[empty] == 0).all()
    assert (np.asarray(norm.weights(q, k, mask)).transpose(0, 2, 1, 3)[empty] == 0).all()
    assert all(np.isfinite(np.asarray(s)).all() for s in stats.values())
    grads = jax.grad(lambda q, k, v: norm(q, k, v, mask)[0].sum(), argnums=(0, 1, 2))(q, k, v)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=R.case_id)
def test_finite_at_logits_of_1e4(case, dtype):
    """Scale q so the logits the normalizer sees (β·q·k; q·k for linear) reach ±1e4."""
    name, _, opts = case
    T, S, mask, m = _mask("grad")
    q, k, v = R.qkv(24, T, S)
    beta = 1.0 if name == "linear" else R.beta_of(R.options(name, **opts), R.H)
    z = beta * R.scores(q, k)
    q = q * np.float32(1e4 / np.abs(np.where(m[:, None], z, 0)).max())
    q, k, v = (jnp.asarray(x, dtype) for x in (q, k, v))
    zq = beta * R.scores(np.asarray(q, np.float32), np.asarray(k, np.float32))
    assert zq.max() > 5e3 and zq.min() < -5e3
    norm = _build(name, opts)

    def loss(q, k, v):
        out, stats = norm(q, k, v, mask, with_stats=True)
        return jnp.sum(out.astype(jnp.float32) * jnp.cos(jnp.arange(out.size)).reshape(out.shape)), (out, stats)

    grads, (out, stats) = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    assert out.dtype == dtype
    assert np.isfinite(np.asarray(out, np.float32)).all()
    assert all(np.isfinite(np.asarray(s)).all() for s in stats.values()), stats
    assert all(np.isfinite(np.asarray(g, np.float32)).all() for g in grads)
    w = np.asarray(norm.weights(q, k, mask))
    assert np.isfinite(w).all() and (w >= 0).all()


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
