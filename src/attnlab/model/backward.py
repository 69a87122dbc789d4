"""Hand-written backwards: a dense layer's matmul and GELU, which XLA:CPU runs faster than autodiff's, and the
token embedding's lookup, whose gradient autodiff would sum in the compute dtype.

The matmul: autodiff of `x @ W` transposes the dot_general, and XLA:CPU then lays the weight gradient out as
a dot over the leading (token) axis whose operands are transposed inside the elementwise fusions
that produce them (for the MLP: the GELU derivative recomputed in a strided layout). Writing the
two backward products explicitly, dx = g·Wᵀ and dW = xᵀ·g over the flattened tokens, gives plain
matmuls instead: the default model's MLP forward+backward takes 11 ms of CPU time against autodiff's 36 ms
(BENCHMARKS.md, "Training step"). Same products, so the same numbers up to float rounding.

GELU (tanh form, as jax.nn.gelu): autodiff keeps tanh and its products and walks the (B,T,4D)
activation in four fusions; the closed-form derivative recomputed in the backward needs two.
tests/model/test_reference.py pins both against plain autodiff.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp


@jax.custom_vjp
def matmul(x_XI, w_IO):
    """x @ w over the last axis of x (any leading axes)."""
    return x_XI @ w_IO


def _matmul_fwd(x_XI, w_IO):
    return x_XI @ w_IO, (x_XI, w_IO)


def _matmul_bwd(res, g_XO):
    x_XI, w_IO = res
    dx_XI = (g_XO @ w_IO.T.astype(g_XO.dtype)).astype(x_XI.dtype)
    x_MI, g_MO = x_XI.reshape(-1, x_XI.shape[-1]), g_XO.reshape(-1, g_XO.shape[-1])
    dw_IO = jnp.matmul(x_MI.T, g_MO.astype(x_MI.dtype), preferred_element_type=jnp.float32)
    return dx_XI, dw_IO.astype(w_IO.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    """A drop-in `dot_general` for nnx.Linear (contracting lhs's last axis with rhs's first) using `matmul`."""
    (contract_l, contract_r), (batch_l, batch_r) = dimension_numbers
    if tuple(contract_l) != (lhs.ndim - 1,) or tuple(contract_r) != (0,) or batch_l or batch_r or precision is not None:
        return jax.lax.dot_general(
            lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type, **kwargs
        )
    out = matmul(lhs, rhs)
    return out if preferred_element_type is None else out.astype(preferred_element_type)


_C = math.sqrt(2 / math.pi)


@jax.custom_vjp
def gelu(x):
    """jax.nn.gelu(x) (tanh approximation, its default)."""
    return jax.nn.gelu(x)


def _gelu_fwd(x):
    return jax.nn.gelu(x), x


def _gelu_bwd(x, g):
    # d/dx ½x(1 + tanh u), u = c(x + 0.044715x³): ½(1 + t) + ½x(1 − t²)·c(1 + 3·0.044715x²)
    xf = x.astype(jnp.float32)
    t = jnp.tanh(_C * (xf + 0.044715 * xf**3))
    d = 0.5 * (1 + t) + 0.5 * xf * (1 - t * t) * _C * (1 + 3 * 0.044715 * xf * xf)
    return ((g.astype(jnp.float32) * d).astype(x.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def take_rows(table_VD, ids, dtype):
    """table_VD's rows at ids in `dtype` (as nnx.Embed looks tokens up), whose gradient is scatter-added in float32.

    Autodiff scatter-adds the cotangent in the compute dtype: in bfloat16 a frequent token's row sums thousands of
    updates at 8 significant bits (8192 bytes of the shipped lm text: 4% of the largest entry off the exact sum,
    tests/model/test_reference.py). On an H100 that bfloat16 scatter also took 58-63 ms of the 65-74 ms
    model=base lm step (BENCHMARKS.md); the float32 one has not been timed there. In float32 runs this is
    autodiff's scatter itself."""
    return jnp.take(table_VD.astype(dtype), ids, axis=0)


def _take_rows_fwd(table_VD, ids, dtype):
    return take_rows(table_VD, ids, dtype), (table_VD, ids)


def _take_rows_bwd(dtype, residuals, g_BTD):
    table_VD, ids = residuals
    _, pullback = jax.vjp(lambda t: jnp.take(t, ids, axis=0), table_VD.astype(jnp.float32))
    return pullback(g_BTD.astype(jnp.float32))[0].astype(table_VD.dtype), None


take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)
