"""model.remat: the loss, every gradient and the statistics are those of remat=false, and the compiled
backward needs less memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab.config import normalizer as build_normalizer
from attnlab.model import Transformer


def _body(remat, names=("softmax",), layers=3, d_model=16, T=12):
    makers = [lambda name=n, **kw: build_normalizer(name, **kw) for n in names]
    return Transformer(
        d_model=d_model,
        heads=2,
        layers=layers,
        mlp_ratio=2,
        dropout=0.0,
        positional="rope",
        max_len=T,
        causal=True,
        qk_norm=False,
        pooled=False,
        make_normalizer=makers,
        seq_len=T,
        vocab_size=11,
        remat=remat,
        rngs=nnx.Rngs(0),
    )


def _loss_grads(body, inputs, valid, ct):
    graphdef, params, rest = nnx.split(body, nnx.Param, ...)

    def loss(params):
        feats, stats = nnx.merge(graphdef, params, rest)(
            inputs, valid, with_stats=True, deterministic=False, rngs=nnx.Rngs(dropout=0)
        )
        return jnp.sum(feats * ct), stats

    (value, stats), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return value, stats, grads


@pytest.mark.parametrize("names", [("softmax",), ("linear",), ("softmax", "linear")], ids="-".join)
def test_remat_gives_the_same_loss_gradients_and_statistics(names):
    """Scan over identical blocks (softmax, linear) and the unrolled fallback for mixed layers."""
    T = 12
    rng = np.random.default_rng(0)
    inputs = jnp.asarray(rng.integers(1, 11, size=(2, T)), jnp.int32)
    valid = jnp.asarray(np.arange(T)[None] < np.array([[T], [T - 3]]))
    ct = jnp.asarray(rng.normal(size=(2, T, 16)), jnp.float32)
    ref_value, ref_stats, ref_grads = _loss_grads(_body(False, names), inputs, valid, ct)
    for remat in (True, "dots"):
        value, stats, grads = _loss_grads(_body(remat, names), inputs, valid, ct)
        np.testing.assert_allclose(value, ref_value, rtol=1e-6)
        for (path, g), (_, r) in zip(
            jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves_with_path(ref_grads)
        ):
            r = np.asarray(r)  # float32 rounding of a recomputation, at the scale of the leaf's largest entry
            np.testing.assert_allclose(
                np.asarray(g), r, rtol=1e-5, atol=1e-5 * np.abs(r).max(), err_msg=f"{remat} {path}"
            )
        assert stats.keys() == ref_stats.keys()
        for k in stats:
            np.testing.assert_allclose(np.asarray(stats[k]), np.asarray(ref_stats[k]), rtol=1e-5, err_msg=k)


def test_remat_lowers_the_compiled_backward_memory():
    T, D = 512, 64

    def peak(remat):
        body = _body(remat, layers=6, d_model=D, T=T)
        graphdef, params, rest = nnx.split(body, nnx.Param, ...)
        inputs = jnp.ones((2, T), jnp.int32)

        def loss(params):
            return jnp.sum(nnx.merge(graphdef, params, rest)(inputs, jnp.ones((2, T), bool))[0] ** 2)

        ma = jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis()
        return ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes

    plain = peak(False)
    assert peak(True) < 0.6 * plain, (peak(True), plain)


def test_bad_remat_is_refused_naming_the_option():
    with pytest.raises(ValueError, match=r"model.remat='yes' is invalid; allowed: false, true, dots"):
        _body("yes")
