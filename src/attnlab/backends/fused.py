"""softmax(βq·kᵀ)v by jax.nn.dot_product_attention (cuDNN flash attention or XLA), the mask passed as structure.

The mask never becomes a dense T×S array or bias (that turns cuDNN's flash kernel off): causality is
`is_causal`, right padding `key_value_seq_lengths`, a sliding window `local_window_size`
(backends/impl.py decides which masks qualify).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .mask import Mask


def fused_attention(q_BNTH, k_BNSH, v_BNSH, mask: Mask, log_beta_N, implementation: str):
    """The attended (B,N,T,H) output; a row with no admissible key is zero, as in the dense form.

    β = exp(log β) is folded into q (scale=1) by `scale_queries`. The kernel takes (B,T,N,H): the transposes
    happen here.
    """
    B, N, T, _ = q_BNTH.shape
    S = k_BNSH.shape[2]
    q = scale_queries(q_BNTH, log_beta_N)
    lengths_B = query_lengths_B = None
    if mask.key_valid_BS is not None:
        lengths_B = jnp.broadcast_to(mask.key_valid_BS, (B, S)).astype(jnp.int32).sum(-1)
        lengths_B = batched_like(lengths_B, jax.lax.stop_gradient(q))
        if implementation == "cudnn":  # cuDNN takes query lengths with key lengths (every query counts here)
            query_lengths_B = batched_like(jnp.full((B,), T, jnp.int32), jax.lax.stop_gradient(q))
    window = None
    if mask.window is not None:  # (left, right) keys beside the diagonal: p − s < w, and |p − s| < w without causal
        window = (mask.window - 1, 0 if mask.causal else mask.window - 1)
    btnh = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    out_BTNH = jax.nn.dot_product_attention(
        btnh(q),
        btnh(k_BNSH),
        btnh(v_BNSH),
        scale=1.0,
        is_causal=mask.causal,
        query_seq_lengths=query_lengths_B,
        key_value_seq_lengths=lengths_B,
        local_window_size=window,
        implementation=implementation,
    )
    out_BNTH = btnh(out_BTNH)
    # The kernel makes a row with no admissible key uniform over all keys (its masked logits are a large
    # finite negative, not −inf); the dense form makes it zero. Such rows: no valid key at all, or (with a
    # window) a padded query further than the window from the last valid key.
    row_ok_BT = empty_rows_ok(lengths_B, mask.window, T, B)
    if row_ok_BT is None:
        return out_BNTH
    # `where`, not a product: whatever the kernel leaves in a row with no key (NaN included) must not pass.
    return jnp.where(row_ok_BT[:, None, :, None], out_BNTH, jnp.zeros((), out_BNTH.dtype))


@jax.custom_vjp
def scale_queries(q_BNTH, log_beta_N):
    """β_n·q (β = exp log β) in float32, rounded to q's dtype: the queries the kernel takes."""
    return (q_BNTH.astype(jnp.float32) * jnp.exp(log_beta_N)[None, :, None, None]).astype(q_BNTH.dtype)


def _scale_queries_fwd(q_BNTH, log_beta_N):
    qs_BNTH = scale_queries(q_BNTH, log_beta_N)
    # The barrier keeps the scaled queries themselves (the kernel's saved operand) for the backward: without it
    # XLA rebuilds them from q, which with RoPE means writing each layer's rotated q out for this one sum.
    return qs_BNTH, (jax.lax.optimization_barrier(qs_BNTH), log_beta_N)


def _scale_queries_bwd(res, g_BNTH):
    """dq = β·g and d(log β) = β·Σ g·q = Σ g·(βq), reduced in float32."""
    qs_BNTH, log_beta_N = res
    g32_BNTH = g_BNTH.astype(jnp.float32)
    dlog_beta_N = jnp.sum(g32_BNTH * qs_BNTH.astype(jnp.float32), (0, 2, 3))
    dq_BNTH = g32_BNTH * jnp.exp(log_beta_N)[None, :, None, None]
    return dq_BNTH.astype(qs_BNTH.dtype), dlog_beta_N.astype(log_beta_N.dtype)


scale_queries.defvjp(_scale_queries_fwd, _scale_queries_bwd)


@jax.custom_batching.custom_vmap
def batched_like(lengths_B, q):
    """`lengths_B` (sequence lengths) itself; under vmap, batched whenever `q` is.

    jax 0.10's batching rule for cuDNN attention (jax/_src/cudnn/fused_attention_stablehlo.py,
    _dot_product_attention_fwd_batcher) folds the vmapped axis into the batch of every operand, so
    lengths shared by vmapped queries (seeds vmapped over one batch) fail to reshape. Copying them
    per vmapped index gives every operand the same batching; it adds no work (lengths are B integers).
    `q` must come through stop_gradient: a custom_vmap function has no reverse-mode rule, and with a
    zero tangent autodiff never asks for one.
    """
    del q
    return lengths_B


@batched_like.def_vmap
def _batched_like_rule(axis_size, in_batched, lengths_B, q):
    """Broadcast the lengths over the vmapped axis when the queries are batched and they are not."""
    lengths_batched, q_batched = in_batched
    if q_batched and not lengths_batched:
        return jnp.broadcast_to(lengths_B, (axis_size, *lengths_B.shape)), True
    return lengths_B, lengths_batched


def empty_rows_ok(lengths_B, window: int | None, T: int, B: int):
    """(B,T) True where a query row has an admissible key (T = S here), or None when every row has one."""
    if lengths_B is None:
        return None
    pos_T = jnp.arange(T)
    ok_BT = jnp.broadcast_to(lengths_B[:, None] > 0, (B, T))
    if window is not None:  # the nearest valid key to a query past the end is key L − 1
        ok_BT = ok_BT & (pos_T[None, :] - (lengths_B[:, None] - 1) < window)
    return ok_BT
