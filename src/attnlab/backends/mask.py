"""The admissible-key mask: causal, sliding window, padding and explicit masks, kept structured.

Shape letters: B batch, N heads, T queries, S keys, R a subset of query rows (sampled statistics).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

# Masked logits get this offset below the row's admissible maximum instead of -inf: -inf broke
# sparsemax/entmax (deep-spin/entmax #17) and turns fully padded rows into NaN.
MASK_GAP = 1e4


@struct.dataclass
class Mask:
    """Admissible keys: causal ∧ not padding, kept structured so O(T) forms need no T×S mask.

    `dense_BTS` (optional) is an arbitrary explicit mask, combined with the rest by ∧;
    `dense_BNTS` (optional) is one per head, jax.nn.dot_product_attention's convention (any of its
    axes may be 1 and broadcasts).
    Under `causal` with T < S, query t sees keys s ≤ t + S − T (the queries are the last T).
    """

    key_valid_BS: jax.Array | None = None
    dense_BTS: jax.Array | None = None
    dense_BNTS: jax.Array | None = None
    causal: bool = struct.field(pytree_node=False, default=False)
    # Sliding window: a query at position p sees keys at positions s with p − s < window (causal:
    # its `window` most recent keys, itself included) or |p − s| < window (bidirectional).
    window: int | None = struct.field(pytree_node=False, default=None)
    # key_valid_BS is True on a prefix of each row (right padding, the Task contract), so it is a
    # length: jax.nn.dot_product_attention's key_value_seq_lengths can express it (backends/fused.py).
    right_padded: bool = struct.field(pytree_node=False, default=False)

    def positional_TS(self, q_pos_T, k_pos_S) -> jax.Array | None:
        """The causal ∧ window part of the mask for query/key positions (None if neither applies)."""
        d_TS = q_pos_T[:, None] - k_pos_S[None, :]
        m_TS = None
        if self.causal:
            m_TS = d_TS >= 0
        if self.window is not None:
            w_TS = (d_TS < self.window) if self.causal else (jnp.abs(d_TS) < self.window)
            m_TS = w_TS if m_TS is None else m_TS & w_TS
        return m_TS

    @property
    def has_dense(self) -> bool:
        """Whether an arbitrary explicit mask is part of it (O(T) forms then fall back to the T×S one)."""
        return self.dense_BTS is not None or self.dense_BNTS is not None

    def matrix_B1TS(self, T: int, S: int, rows_R=None) -> jax.Array:
        """The explicit boolean mask, broadcastable to (B, N, T, S) ((B, N, T, S) itself with dense_BNTS);
        with `rows_R`, only those query rows (R in place of T: sampled statistics at length)."""
        q_pos_R = (jnp.arange(T) if rows_R is None else jnp.asarray(rows_R)) + (S - T)
        m_BRS = jnp.ones((1, q_pos_R.shape[0], S), bool)
        pos_RS = self.positional_TS(q_pos_R, jnp.arange(S))
        if pos_RS is not None:
            m_BRS = m_BRS & pos_RS[None]
        if self.key_valid_BS is not None:
            m_BRS = m_BRS & self.key_valid_BS[:, None, :].astype(bool)
        rows = lambda d: d if rows_R is None or d.shape[-2] == 1 else d[..., rows_R, :]  # noqa: E731
        if self.dense_BTS is not None:
            m_BRS = m_BRS & rows(self.dense_BTS.astype(bool))
        if self.dense_BNTS is not None:
            return m_BRS[:, None] & rows(self.dense_BNTS.astype(bool))
        return m_BRS[:, None]


MASK_SHAPES = "a Mask, or a boolean array of shape (B, T, S) or (B, N, T, S) (jax.nn's convention), any axis 1 or full"


def as_mask(mask, causal: bool = False, shape_BNTS: tuple[int, int, int, int] | None = None) -> Mask:
    """Accept None, a Mask, or a boolean (B,T,S) or (B,N,T,S) array whose axes are full or 1 (broadcast).

    With `shape_BNTS` (the attention's B, N, T, S) an array's shape is checked against it, so a wrong
    one fails here with the accepted shapes instead of deep inside an einsum.
    """
    if mask is None:
        return Mask(causal=causal)
    if isinstance(mask, Mask):
        return mask.replace(causal=mask.causal or causal)
    m = jnp.asarray(mask)
    full = None if shape_BNTS is None else (shape_BNTS if m.ndim == 4 else shape_BNTS[:1] + shape_BNTS[2:])
    fits = m.ndim in (3, 4) and (full is None or all(a in (1, f) for a, f in zip(m.shape, full)))
    if not fits:
        wanted = "" if shape_BNTS is None else f" with (B, N, T, S) = {tuple(shape_BNTS)}"
        raise ValueError(f"mask of shape {tuple(m.shape)} does not fit the attention{wanted}; allowed: {MASK_SHAPES}")
    if m.ndim == 4 and m.shape[1] == 1:  # no head axis: the structured (B, T, S) form keeps O(T) paths open
        m = m[:, 0]
    if m.ndim == 4:
        return Mask(dense_BNTS=m.astype(bool), causal=causal)
    return Mask(dense_BTS=m.astype(bool), causal=causal)


def masked_max(x_BNTS, m_B1TS, keepdims=True):
    """Row maximum over admissible entries (0 where a row has none), without gradient."""
    x = jnp.where(m_B1TS, x_BNTS, -jnp.inf).max(-1, keepdims=keepdims)
    return jax.lax.stop_gradient(jnp.where(jnp.isfinite(x), x, 0.0))


def masked_softmax(logits_BNTS, m_B1TS):
    """softmax over admissible keys; a row with none is all zeros (never NaN)."""
    # -inf before exp (not after) keeps the gradient finite where a masked logit is huge.
    e = jnp.exp(jnp.where(m_B1TS, logits_BNTS - masked_max(logits_BNTS, m_B1TS), -jnp.inf))
    s = e.sum(-1, keepdims=True)
    return e / jnp.where(s > 0, s, 1.0)
