"""Forgetting attention (Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate", ICLR 2025).

    o_i = Σ_j F_ij e^{βq_i·k_j} v_j / Σ_j F_ij e^{βq_i·k_j},  F_ij = ∏_{l=j+1}^{i} f_l,  f_t = σ(w_fᵀ x_t + b_f)

per head (the paper's Eqs. 4–6): softmax(βz + c_i − c_j) over the admissible keys with c_t = Σ_{l≤t} log f_l, a
data-dependent recency bias (KL's recency prior, kl.yaml, is its constant-gate case). x is the layer's input
(the normalised hidden state the q, k, v projections read), which attention passes to a normalizer that says
`takes_layer_input`; the gate projection (w_f, b_f) is this normalizer's parameter. As in flash-linear-attention
(fla/layers/forgetting_attn.py, which unpads the sequence), a padded position forgets nothing: log f = 0 there.
Causal attention only: for a key after the query the product has no meaning.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.backends import blockwise
from attnlab.backends.blockwise import BlockForm
from attnlab.backends.impl import Workload
from attnlab.backends.mask import Mask, masked_softmax
from attnlab.checks import ConfigError
from attnlab.options import normalizers as normalizer_options

from .base import NormalizerParam, ScoreNormalizer


class Forgetting(ScoreNormalizer):
    """softmax(βz + Σ_{l=j+1}^{i} log f_l) over admissible keys, f_t = σ(w_fᵀx_t + b_f) per head (FoX, Lin et al.
    2025); causal only; without a layer input (attnlab.config.attend) x = 0, the gate σ(b_f) of every position."""

    causal_only = True
    takes_layer_input = True

    # without a layer input (the shared checks pass none): the gate σ(b_f) at every position; another gate
    # bias, and the soft cap, which its reference applies itself
    check_variants = types.MappingProxyType(
        {"default": {}, "gate2-beta1": {"gate_bias": 2.0, "beta": 1.0}, "softcap1": {"softcap": 1.0}}
    )

    def __init__(self, *, num_heads, head_dim, rngs, gate_bias=0.0, **shared):
        normalizer_options.forgetting(gate_bias=gate_bias)
        b_f = float(gate_bias)
        d_model = num_heads * head_dim
        # w_f: a projection of the layer input like q, k, v (attention tags it: the attention group, weight-decayed
        # as a matrix), flax's default Linear kernel init (LeCun normal); b_f (`gate_bias`): a normalizer parameter.
        self.gate_w = nnx.Param(jax.nn.initializers.lecun_normal()(rngs.params(), (d_model, num_heads)))
        self.gate_b = NormalizerParam(jnp.full((num_heads,), b_f, jnp.float32))
        super().__init__(num_heads=num_heads, head_dim=head_dim, rngs=rngs, **shared)

    @staticmethod
    def require_causal(mask: Mask) -> None:
        """Refuse a bidirectional mask: the gates multiply from the key up to the query."""
        if not mask.causal:
            raise ConfigError(
                "normalizer=forgetting needs causal attention (its forget gates multiply from each key up to the "
                "query) and this mask is bidirectional; allowed: a causal mask (per-token tasks with "
                "model.causal=null|true; attend(..., causal=True))"
            )

    def log_forget(self, layer_input_BSD, mask: Mask, B: int, S: int):
        """log f_t (B,N,S) = log σ(w_fᵀx_t + b_f), 0 at padded positions; no layer input: x = 0."""
        if layer_input_BSD is None:
            a_BSN = jnp.broadcast_to(self.gate_b[...], (B, S, self.gate_b.shape[0]))
        else:
            if layer_input_BSD.shape[1] != S:
                raise ValueError(f"layer input of length {layer_input_BSD.shape[1]} for {S} keys: one per key")
            a_BSN = layer_input_BSD.astype(jnp.float32) @ self.gate_w[...] + self.gate_b[...][None, None, :]
        log_f_BNS = jax.nn.log_sigmoid(a_BSN).transpose(0, 2, 1)
        if mask.key_valid_BS is not None:
            log_f_BNS = jnp.where(mask.key_valid_BS[:, None, :], log_f_BNS, 0.0)
        return log_f_BNS

    def normalize_rows(self, z_BNRS, m_B1RS, q_pos_R, log_f_BNS=None):
        return self.normalize(z_BNRS, m_B1RS, q_pos_R, log_f_BNS)

    def normalize(self, z_BNTS, m_B1TS, q_pos_T=None, log_f_BNS=None):
        """(weights, logits, extras) with log_f_BNS the keys' log forget gates (None: log σ(b_f) everywhere)."""
        B, N, T, S = z_BNTS.shape
        q_pos_T = jnp.arange(T) + (S - T) if q_pos_T is None else q_pos_T
        if log_f_BNS is None:
            log_f_BNS = jnp.broadcast_to(jax.nn.log_sigmoid(self.gate_b[...])[None, :, None], (1, N, S))
        c_BNS = jnp.cumsum(log_f_BNS, -1)
        beta_N = self.beta()
        logits_BNTS = beta_N[None, :, None, None] * z_BNTS
        # c_i − c_j = Σ_{l=j+1}^{i} log f_l ≤ 0 on causal keys (the paper's Eq. 6 as fla's naive reference).
        x_BNTS = logits_BNTS + c_BNS[:, :, q_pos_T][..., None] - c_BNS[:, :, None, :]
        extras = {"beta": beta_N, "forget_gate": self._mean_gate(log_f_BNS, m_B1TS)}
        return masked_softmax(x_BNTS, m_B1TS), logits_BNTS, extras

    @staticmethod
    def _mean_gate(log_f_BNS, m_B1TS):
        """Per head, the mean forget gate f over the keys some query may attend to."""
        used_B1S = m_B1TS.any(-2)
        shape = jnp.broadcast_shapes(used_B1S.shape, log_f_BNS.shape)
        f_BNS, used = jnp.broadcast_to(jnp.exp(log_f_BNS), shape), jnp.broadcast_to(used_B1S, shape)
        return jnp.where(used, f_BNS, 0.0).sum((0, 2)) / jnp.maximum(used.sum((0, 2)), 1)

    def block_form(self):
        """The blockwise form with no layer input and no padding, the gate σ(b_f) at every position, so
        Σ_{l=j+1}^{i} log f_l = (i − j)·log σ(b_f): what the backend table runs when called directly; __call__ runs
        `gated_form` with the batch's gates."""

        def logits(p, z, q_pos, k_pos, n):
            d_QK = (q_pos[:, None] - k_pos[None, :]).astype(jnp.float32)
            x = p["beta"][None, :, None, None] * self.capped_scores(z, p["beta"])
            return x + jax.nn.log_sigmoid(p["b"])[None, :, None, None] * d_QK[None, None]

        return BlockForm("exp", {"beta": self.beta(), "b": self.gate_b[...]}, logits, softcap=self.softcap)

    def gated_form(self, log_f_BNS):
        """The blockwise form with the gates' cumulative sums c (B,N,S) as a differentiated parameter."""

        def logits(p, z, q_pos, k_pos, n):
            c_q = jnp.take(p["c"], q_pos, axis=2, mode="clip")  # positions past S: padded rows or masked keys
            c_k = jnp.take(p["c"], k_pos, axis=2, mode="clip")
            x = p["beta"][None, :, None, None] * self.capped_scores(z, p["beta"])
            return x + c_q[..., None] - c_k[:, :, None, :]

        return BlockForm("exp", {"beta": self.beta(), "c": jnp.cumsum(log_f_BNS, -1)}, logits, softcap=self.softcap)

    def __call__(
        self, q_BNTH, k_BNSH, v_BNSH, mask: Mask, *, with_stats=False, score_probe_BNTS=None, layer_input_BTD=None
    ):
        self.require_causal(mask)
        B, N, T, _ = q_BNTH.shape
        S = k_BNSH.shape[2]
        log_f_BNS = self.log_forget(layer_input_BTD, mask, B, S)
        path = self.backend(T, S, mask, q_BNTH.dtype, Workload(B, N)).name
        if path == "blockwise" and not with_stats and score_probe_BNTS is None:
            return blockwise.attention(self.gated_form(log_f_BNS), q_BNTH, k_BNSH, v_BNSH, mask, self.block_size), {}
        # Statistics and the score probe by the dense form (the gates' row bias needs each row whole there).
        normalize = lambda z, m: self.normalize(z, m, None, log_f_BNS)  # noqa: E731
        return self._dense(q_BNTH, k_BNSH, v_BNSH, mask, with_stats, score_probe_BNTS, normalize=normalize)

    def weights(self, q_BNTH, k_BNSH, mask: Mask, layer_input_BTD=None):
        self.require_causal(mask)
        B, _, T, _ = q_BNTH.shape
        S = k_BNSH.shape[2]
        log_f_BNS = self.log_forget(layer_input_BTD, mask, B, S)
        return self.normalize(self._scores(q_BNTH, k_BNSH), mask.matrix_B1TS(T, S), None, log_f_BNS)[0]

    def reference(self, q_BNTH, k_BNSH, admissible_BTS, layer_input_BTD=None, key_valid_BS=None):
        """Float64 numpy (weights_BNTS, logits_BNTS, extras) of Eqs. 4–6 with the products ∏ f_l written out;
        key_valid_BS None: a key no query may attend to is padding (its gate 1)."""
        q, k = np.asarray(q_BNTH, np.float64), np.asarray(k_BNSH, np.float64)
        B, N, T, _ = q.shape
        S = k.shape[2]
        beta_N = np.asarray(self.beta(), np.float64)
        w_f, b_f = np.asarray(self.gate_w[...], np.float64), np.asarray(self.gate_b[...], np.float64)
        x_BSD = np.zeros((B, S, w_f.shape[0])) if layer_input_BTD is None else np.asarray(layer_input_BTD, np.float64)
        f_BSN = 1.0 / (1.0 + np.exp(-(x_BSD @ w_f + b_f)))
        valid_BS = admissible_BTS.any(1) if key_valid_BS is None else np.asarray(key_valid_BS, bool)
        f_BSN = np.where(valid_BS[..., None], f_BSN, 1.0)
        logits = beta_N[None, :, None, None] * np.einsum("bnth,bnsh->bnts", q, k)
        if self.softcap is not None:
            logits = self.softcap * np.tanh(logits / self.softcap)
        w = np.zeros_like(logits)
        for b, n, t in np.ndindex(B, N, T):
            i = t + S - T
            idx = np.flatnonzero(admissible_BTS[b, t])
            if idx.size:
                decay = np.array([np.prod(f_BSN[b, j + 1 : i + 1, n]) for j in idx])
                e = decay * np.exp(logits[b, n, t, idx] - logits[b, n, t, idx].max())
                w[b, n, t, idx] = e / e.sum()
        used_BS = admissible_BTS.any(1)
        gate_N = np.array([f_BSN[..., n][used_BS].mean() if used_BS.any() else 0.0 for n in range(N)])
        return w, logits, {"beta": beta_N, "forget_gate": gate_N}
