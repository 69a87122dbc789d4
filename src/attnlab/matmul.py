"""A dense layer's matmul with a hand-written backward, which XLA's CPU backend runs ~3× faster.

Autodiff of `x @ W` transposes the dot_general, and XLA:CPU then lays the weight gradient out as
a dot over the leading (token) axis whose operands are transposed inside the elementwise fusions
that produce them (for the MLP: the GELU derivative recomputed in a strided layout). Writing the
two backward products explicitly, dx = g·Wᵀ and dW = xᵀ·g over the flattened tokens, gives plain
matmuls instead: the default model's MLP forward+backward went from 36 ms to 11 ms of CPU time
(BENCHMARKS.md, "Training step"). Same products, so the same numbers up to float rounding.
"""

from __future__ import annotations

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
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type, **kwargs)
    out = matmul(lhs, rhs)
    return out if preferred_element_type is None else out.astype(preferred_element_type)
