"""Linear attention at length: the chunked and parallel forms agree forward and backward
(padding, every feature map, T not a multiple of the chunk), `impl` picks the path, and statistics
at length come from sampled rows without a T×S array."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.backends import sampled_rows
from attnlab.normalizers.base import core_stats

F32 = jnp.float32

B, N, H = 2, 3, 8


def _linear(**opts):
    return config.normalizer("linear", num_heads=N, head_dim=H, rngs=nnx.Rngs(0), **{"num_features": 16, **opts})


def _qkv(seed, T):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(size=(B, N, T, H)).astype(np.float32)) for _ in range(3))


@pytest.mark.parametrize("feature_map", ["elu1", "relu", "favor"])
def test_chunked_and_parallel_agree_forward_and_backward(feature_map):
    T = 23  # not a multiple of chunk_size 4 or 8
    q, k, v = _qkv(1, T)
    valid = jnp.asarray(np.arange(T)[None] < np.array([[T], [T - 5]]))  # second row right-padded
    mask = nz.Mask(key_valid_BS=valid, causal=True)
    ct = jnp.asarray(np.random.default_rng(2).normal(size=(B, N, T, H)).astype(np.float32))

    def loss(form, chunk):
        norm = _linear(feature_map=feature_map, chunk_size=chunk, impl=form)
        assert norm.backend(T, T, mask, F32).name == form
        f = lambda q, k, v: norm(q, k, v, mask)[0]  # noqa: E731
        return jax.value_and_grad(lambda q, k, v: jnp.sum(f(q, k, v) * ct), argnums=(0, 1, 2))(q, k, v)

    ref_val, ref_grads = loss("parallel", 4)
    for form, chunk in (("chunked", 4), ("chunked", 8)):
        val, grads = loss(form, chunk)
        np.testing.assert_allclose(val, ref_val, rtol=1e-5, err_msg=f"{form} C={chunk}")
        for g, r, name in zip(grads, ref_grads, "qkv"):
            np.testing.assert_allclose(
                np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5, err_msg=f"d{name}, {form} C={chunk}"
            )
        # Padded keys/values get no gradient in any form.
        assert np.all(np.asarray(grads[1])[1, :, T - 5 :] == 0) and np.all(np.asarray(grads[2])[1, :, T - 5 :] == 0)


def test_implementation_names_the_path():
    causal, T = nz.Mask(causal=True), 200
    assert _linear(chunk_size=64).backend(T, T, causal, F32).name == "chunked"
    assert _linear(chunk_size=256).backend(T, T, causal, F32).name == "parallel"  # one chunk: the same matrix
    assert _linear(chunk_size=256, impl="chunked").backend(T, T, causal, F32).name == "chunked"
    assert _linear(impl="parallel").backend(T, T, causal, F32).name == "parallel"
    assert _linear().backend(T, T, nz.Mask(), F32).name == "bidirectional"
    assert _linear(impl="chunked").backend(T, T, nz.Mask(causal=True, window=8), F32).name == "parallel"
    with pytest.raises(ValueError, match="normalizer.impl='flash'"):
        _linear(impl="flash")


def test_statistics_at_length_are_the_dense_statistics_of_sampled_rows():
    T = 1024  # T·T reaches sampled_rows.SAMPLED_MIN_TS: statistics go to sampled rows
    assert sampled_rows.at_length(T, T)
    q, k, v = _qkv(3, T)
    valid = jnp.asarray(np.arange(T)[None] < np.array([[T], [T - 100]]))
    mask = nz.Mask(key_valid_BS=valid, causal=True)
    norm = _linear()
    _, stats = norm(q, k, v, mask, with_stats=True)
    rows = sampled_rows.stats_rows(T)
    assert len(rows) == sampled_rows.STATS_ROWS and rows[0] == 0 and rows[-1] == T - 1
    # Dense reference on those rows, from the explicit weights and a float64 numpy kernel matrix.
    w = norm.weights(q, k, mask)[:, :, rows]
    qf, kf = (np.asarray(norm.phi(x, is_q), np.float64) for x, is_q in ((q, True), (k, False)))
    m = np.asarray(mask.matrix_B1TS(T, T))[:, :, rows]
    a = np.where(m, np.einsum("bnrf,bnsf->bnrs", qf[:, :, rows], kf), 0.0)
    ref = core_stats(w, jnp.asarray(a, jnp.float32), jnp.asarray(m), q_pos_T=jnp.asarray(rows))
    for key in ref:
        np.testing.assert_allclose(np.asarray(stats[key]), np.asarray(ref[key]), rtol=1e-4, err_msg=key)
    np.testing.assert_allclose(np.asarray(stats["min_denominator"]), a.sum(-1).min((0, 2)), rtol=1e-4)


def test_chunked_training_step_builds_no_T_by_S_array():
    """Forward + backward with statistics (aux, as in the train step) at T = 4096: XLA's peak stays far
    below one B×N×T×T float array, which the parallel form needs."""
    T = 4096
    q, k, v = _qkv(4, T)
    mask = nz.Mask(causal=True)

    def peak(norm):
        def f(q, k, v):
            out, stats = norm(q, k, v, mask, with_stats=True)
            return jnp.sum(out), stats

        ma = jax.jit(jax.grad(f, argnums=(0, 1, 2), has_aux=True)).lower(q, k, v).compile().memory_analysis()
        return ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes

    txs = B * N * T * T * 4
    assert peak(_linear()) < txs / 4  # the statistics rows: a few B×N×128×T arrays
    assert peak(_linear(impl="parallel")) > txs


def _chunked_out_and_grads(q, k, v, valid, **opts):
    norm = _linear(chunk_size=16, **opts)
    mask = nz.Mask(key_valid_BS=valid, causal=True, right_padded=True)

    def loss(q, k, v):
        out = norm(q, k, v, mask)[0]
        return jnp.sum(out.astype(jnp.float32) * jnp.cos(jnp.arange(out.size).reshape(out.shape))), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def test_chunked_in_bfloat16_tracks_the_float32_forms_forward_and_backward():
    """bfloat16 compute: the chunk matmuls take bfloat16 operands with float32 accumulation; output and
    gradients stay within bfloat16 rounding of the float32 parallel form on the same (rounded) inputs."""
    T = 77
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(5, T))
    valid = jnp.arange(T)[None] < jnp.array([T, T - 9])[:, None]
    out16, g16 = _chunked_out_and_grads(q, k, v, valid)
    out32, g32 = _chunked_out_and_grads(*(x.astype(jnp.float32) for x in (q, k, v)), valid, impl="parallel")
    assert out16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out16, np.float32), out32, atol=3e-2, rtol=3e-2)
    for a, b in zip(g16, g32):
        scale = np.abs(np.asarray(b)).max()
        np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=3e-2 * scale)


def test_chunked_matmuls_are_tensor_core_shaped():
    """In bfloat16 the four chunk matmuls (φ(K)ᵀV, the intra-chunk weights, weights·V, φ(Q)·state) take
    bfloat16 operands, and no array carries H + 1 columns (a ones column on v for the denominator)."""
    T = 64
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(6, T))
    norm = _linear(chunk_size=16)
    mask = nz.Mask(causal=True)
    assert norm.backend(T, T, mask, F32).name == "chunked"
    jaxpr = jax.make_jaxpr(lambda q, k, v: norm(q, k, v, mask)[0])(q, k, v)

    def subjaxprs(params):  # the jaxprs a primitive holds (scan, custom_vjp, ...): a Jaxpr or a ClosedJaxpr
        for value in params.values():
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(v, "eqns"):
                    yield v
                elif hasattr(getattr(v, "jaxpr", None), "eqns"):
                    yield v.jaxpr

    def eqns(jaxpr):
        for eqn in jaxpr.eqns:
            yield eqn
            for sub in subjaxprs(eqn.params):
                yield from eqns(sub)

    dots = [e for e in eqns(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
    bf16_dots = [e for e in dots if all(x.aval.dtype == jnp.bfloat16 for x in e.invars)]
    assert len(bf16_dots) == 4, [[x.aval for x in e.invars] for e in dots]
    assert all(e.params["preferred_element_type"] in (jnp.float32, jnp.bfloat16) for e in bf16_dots)
    shapes = [v.aval.shape for e in eqns(jaxpr.jaxpr) for v in e.outvars if hasattr(v.aval, "shape")]
    assert not any(s and s[-1] == H + 1 for s in shapes)
