"""softmax(βq·kᵀ)v with a hand-written backward: the training path of softmax on steps without statistics.

Autodiff of the masked softmax chain (max, where, exp, sum, divide) walks the (B,N,T,S) matrix
several times in the backward; the closed form needs one pass (FlashAttention's backward, Dao et
al. 2022, eq. in Alg. 2): with P the weights, O = PV and G = dL/dO,

    dV = PᵀG,  dP = GVᵀ,  dX = P∘(dP − rowsum(G∘O)),  dQ = β·dX·K,  dK = β·dXᵀ·Q,  dβ = Σ Q∘(dX·K),

X = βz the logits (the last identity avoids keeping z: Σₛ dXₜₛ zₜₛ = qₜ·Σₛ dXₜₛ kₛ). The same
function, so the same numbers up to float rounding (tests/normalizers/test_gradients.py checks the
gradients against the float64 references).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .mask import masked_softmax


def _forward(q_BNTH, k_BNSH, v_BNSH, beta_N, m_B1TS):
    z_BNTS = jnp.einsum("bnth,bnsh->bnts", q_BNTH, k_BNSH, preferred_element_type=jnp.float32)
    p_BNTS = masked_softmax(beta_N[None, :, None, None] * z_BNTS, m_B1TS)
    return jnp.einsum("bnts,bnsh->bnth", p_BNTS.astype(v_BNSH.dtype), v_BNSH), p_BNTS


@jax.custom_vjp
def softmax_attention(q_BNTH, k_BNSH, v_BNSH, beta_N, m_B1TS):
    """out_BNTH of softmax(β_n q·kᵀ) over the admissible keys (rows with none give 0)."""
    return _forward(q_BNTH, k_BNSH, v_BNSH, beta_N, m_B1TS)[0]


def _fwd(q_BNTH, k_BNSH, v_BNSH, beta_N, m_B1TS):
    out_BNTH, p_BNTS = _forward(q_BNTH, k_BNSH, v_BNSH, beta_N, m_B1TS)
    return out_BNTH, (q_BNTH, k_BNSH, v_BNSH, beta_N, m_B1TS, p_BNTS, out_BNTH)


def _bwd(res, g_BNTH):
    q, k, v, beta_N, m_B1TS, p_BNTS, out_BNTH = res
    f32 = jnp.float32
    dv_BNSH = jnp.einsum("bnts,bnth->bnsh", p_BNTS.astype(g_BNTH.dtype), g_BNTH, preferred_element_type=f32)
    dp_BNTS = jnp.einsum("bnth,bnsh->bnts", g_BNTH, v, preferred_element_type=f32)
    r_BNT1 = jnp.sum(g_BNTH.astype(f32) * out_BNTH.astype(f32), -1, keepdims=True)
    dx_BNTS = p_BNTS * (dp_BNTS - r_BNT1)
    u_BNTH = jnp.einsum("bnts,bnsh->bnth", dx_BNTS.astype(k.dtype), k, preferred_element_type=f32)
    dk_BNSH = jnp.einsum("bnts,bnth->bnsh", dx_BNTS.astype(q.dtype), q, preferred_element_type=f32)
    b = beta_N[None, :, None, None]
    dbeta_N = jnp.sum(q.astype(f32) * u_BNTH, (0, 2, 3)).astype(beta_N.dtype)
    return ((b * u_BNTH).astype(q.dtype), (b * dk_BNSH).astype(k.dtype), dv_BNSH.astype(v.dtype), dbeta_N, None)


softmax_attention.defvjp(_fwd, _bwd)
