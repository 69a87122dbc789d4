"""The fused Pallas kernels (sigmoid, ReLU, linear) as the accelerator runs them: compiled to Triton on a GPU,
in interpret mode elsewhere, at shapes a GPU takes (head and feature dims of 32, tiles of 16 and more, lengths
no multiple of a tile, right padding), forward and gradients against the dense and parallel forms.

The other Pallas tests run interpret mode only, at dims Triton refuses; these are the ones `make test-numerics`
runs for real on a GPU. Errors are relative norms ‖got − want‖ / ‖want‖: Triton's float32 dot may round its
operands to TF32 (about 1e-3 relative), far below what a wrong formula, mask or tile gives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.backends import pallas_sigmoid

pytestmark = pytest.mark.numerics

INTERPRET = jax.default_backend() != "gpu"
B, N, H = 2, 2, 32
# float32: TF32 operand rounding on a GPU; bfloat16: 8 significant bits in the operands and the gradients.
TOLERANCE = {jnp.float32: 3e-3, jnp.bfloat16: 3e-2}


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.isfinite(got).all(), "a non-finite value"
    assert np.linalg.norm(want) > 0, "a zero reference would test nothing"
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def inputs(T, dtype, seed):
    keys = jax.random.split(jax.random.key(seed), 4)
    q, k, v = (jax.random.normal(key, (B, N, T, H)).astype(dtype) for key in keys[:3])
    return q, k, v, jax.random.normal(keys[3], (B, N, T, H))


def out_and_grads(attend, q, k, v, ct):
    """attend(q, k, v) and the gradients of Σ out·ct w.r.t. q, k, v."""

    def loss(q, k, v):
        out = attend(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * ct), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def padded_causal(T, lengths):
    return nz.Mask(causal=True, key_valid_BS=jnp.arange(T)[None, :] < jnp.array(lengths)[:, None])


def assert_agree(fused, reference, q, k, v, ct):
    out, grads = out_and_grads(fused, q, k, v, ct)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    ref_out, ref_grads = out_and_grads(reference, *f32, ct)
    tol = TOLERANCE[q.dtype.type]
    assert out.dtype == q.dtype
    errors = [rel_err(out, ref_out)] + [rel_err(g, r) for g, r in zip(grads, ref_grads, strict=True)]
    assert max(errors) < tol, f"relative errors (out, dq, dk, dv) {errors} ≥ {tol}"


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("name", ["sigmoid", "relu"])
@pytest.mark.parametrize(("T", "block", "mask"), [(100, 64, padded_causal(100, [100, 77])), (48, 16, nz.Mask())])
def test_pointwise_kernels_equal_the_dense_form(name, dtype, T, block, mask):
    norm = config.normalizer(name, num_heads=N, head_dim=H, impl="dense", beta=0.9)
    norm.beta.theta[...] = norm.beta.theta[...] + jnp.array([0.3, -0.2])  # a per-head β: a head mix-up shows

    def fused(q, k, v):
        return pallas_sigmoid.attention(norm.block_form(), q, k, v, mask, block, interpret=INTERPRET)

    assert_agree(fused, lambda q, k, v: norm.dense_call(q, k, v, mask), *inputs(T, dtype, seed=T))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize(("T", "chunk"), [(100, 64), (40, 16)])
def test_linear_kernels_equal_the_parallel_form(dtype, T, chunk):
    mask = padded_causal(T, [T, T - 13])
    norm = config.normalizer("linear", num_heads=N, head_dim=H, rngs=nnx.Rngs(0), chunk_size=chunk, impl="parallel")

    def fused(q, k, v):
        return norm._pallas(q, k, v, mask, interpret=INTERPRET)

    assert_agree(fused, lambda q, k, v: norm(q, k, v, mask)[0], *inputs(T, dtype, seed=T + 1))
