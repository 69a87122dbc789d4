"""The transformer's loss and parameter gradients equal an independent plain-jnp reference.

The reference is written from the documented model (pre-LN blocks, token + learned positions, qkv
and output projections without bias, GELU MLP, final LayerNorm) in jax.nn.dot_product_attention's
(B,T,N,H) layout with autodiff of plain jnp, and reads the same parameter values. It pins the
fast paths (heads-major layout, attnlab.model.backward's, softmax_vjp's backward) to the same
numbers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab.model import Transformer

pytestmark = pytest.mark.numerics  # `make test-numerics` runs these on whatever accelerator JAX sees

B, T, D, N, V = 3, 7, 16, 2, 11


def layer_norm(x, p, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(jnp.mean(jnp.square(x - mu), -1, keepdims=True) + eps) * p["scale"] + p["bias"]


def reference_features(p, inputs_BT, valid_BT, normalizer: str, causal: bool):
    H = D // N
    x = p["embed"]["embedding"][inputs_BT] + p["pos"]["embedding"][:T][None]
    m_BTS = valid_BT[:, None, :] & (jnp.tril(jnp.ones((T, T), bool)) if causal else True)
    for i in sorted(p["blocks"]):
        blk = p["blocks"][i]
        qkv = (layer_norm(x, blk["ln1"]) @ blk["attn"]["qkv"]["kernel"]).reshape(B, T, 3, N, H)
        q_BTNH, k_BSNH, v_BSNH = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        m = m_BTS[:, None]
        if normalizer == "softmax":  # softmax(βz), β = exp(θ) per head
            beta = jnp.exp(blk["attn"]["normalizer"]["beta"]["theta"])[None, :, None, None]
            z = beta * jnp.einsum("btnh,bsnh->bnts", q_BTNH, k_BSNH)
            e = jnp.where(m, jnp.exp(z - jnp.where(m, z, -jnp.inf).max(-1, keepdims=True)), 0.0)
            a = e / e.sum(-1, keepdims=True)
        else:  # linear, elu+1 features, eps 1e-6 (Katharopoulos et al. 2020)
            phi = lambda u: jax.nn.elu(u) + 1  # noqa: E731
            s = jnp.where(m, jnp.einsum("btnh,bsnh->bnts", phi(q_BTNH), phi(k_BSNH)), 0.0)
            a = s / (s.sum(-1, keepdims=True) + 1e-6)
        o = jnp.einsum("bnts,bsnh->btnh", a, v_BSNH).reshape(B, T, D)
        x = x + o @ blk["attn"]["out"]["kernel"]
        fc1, fc2 = blk["fc1"], blk["fc2"]
        x = x + jax.nn.gelu(layer_norm(x, blk["ln2"]) @ fc1["kernel"] + fc1["bias"]) @ fc2["kernel"] + fc2["bias"]
    return layer_norm(x, p["ln_f"])


@pytest.mark.parametrize("normalizer", ["softmax", "linear"])
@pytest.mark.parametrize("causal", [True, False])
def test_loss_and_gradients_equal_the_reference(normalizer, causal):
    model = Transformer(
        d_model=D,
        heads=N,
        layers=2,
        mlp_ratio=2,
        dropout=0.0,
        positional="learned",
        max_len=T,
        causal=causal,
        qk_norm=False,
        pooled=False,
        seq_len=T,
        vocab_size=V,
        make_normalizer=lambda **kw: config.normalizer(normalizer, **kw),
        rngs=nnx.Rngs(0),
    )
    rng = np.random.default_rng(1)
    inputs = jnp.asarray(rng.integers(0, V, (B, T)))
    valid = jnp.asarray(np.arange(T)[None] < np.array([[T], [4], [1]]))  # padded rows, one nearly empty
    c_BTD = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def model_loss(params):
        return jnp.sum(c_BTD * nnx.merge(graphdef, params, rest)(inputs, valid)[0])

    def ref_loss(p):
        with jax.numpy_rank_promotion("allow"):  # the plain-jnp reference broadcasts numpy-style on purpose
            return jnp.sum(c_BTD * reference_features(p, inputs, valid, normalizer, causal))

    loss, grads = jax.value_and_grad(model_loss)(params)
    ref, ref_grads = jax.value_and_grad(ref_loss)(nnx.to_pure_dict(params))
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    got = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(grads))[0]
    want = jax.tree_util.tree_flatten_with_path(ref_grads)[0]
    assert [k for k, _ in got] == [k for k, _ in want]
    for (path, g), (_, r) in zip(got, want):
        scale = float(np.abs(r).max()) + 1e-6
        np.testing.assert_allclose(g, r, atol=2e-5 * scale, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_embedding_gradient_sums_in_float32_whatever_the_compute_dtype(dtype):
    """model.backward.take_rows: the rows in the compute dtype, and dW = Σ_n e_{id_n} g_nᵀ against float64 numpy on the
    shipped lm text's bytes (a few byte values take most of the 8192 updates). Scatter-added in bfloat16, as
    autodiff of the bfloat16 lookup does, they are off by 4% of the largest entry (measured)."""
    from attnlab.model.backward import take_rows
    from attnlab.tasks.lm import corpus

    ids = np.frombuffer(b"".join(corpus.pydoc_topics()[0])[:8192], np.uint8).astype(np.int32)
    table = jax.random.normal(jax.random.key(0), (257, 64))
    g = jax.random.normal(jax.random.key(1), (8192, 64)).astype(dtype)
    rows, pullback = jax.vjp(lambda t: take_rows(t, jnp.asarray(ids), dtype), table)
    np.testing.assert_array_equal(rows, table.astype(dtype)[ids])
    (grad,) = pullback(g)
    want = np.zeros((257, 64))
    np.add.at(want, ids, np.asarray(g, np.float64))
    assert grad.dtype == table.dtype
    assert np.abs(np.asarray(grad, np.float64) - want).max() < 1e-5 * np.abs(want).max()
