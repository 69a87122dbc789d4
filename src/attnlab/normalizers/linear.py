"""Linear attention: φ(q)·φ(k) / Σ φ(q)·φ(k) (Katharopoulos et al. 2020, "Transformers are RNNs")."""

from __future__ import annotations

import math
import types

import jax
import jax.numpy as jnp
import numpy as np

from attnlab import checks
from attnlab.backends import pallas_linear, sampled_rows
from attnlab.backends.impl import Capability, Workload
from attnlab.backends.mask import Mask
from attnlab.options import normalizers as normalizer_options

from . import reference as ref
from .base import FixedFeatures, Normalizer, core_stats


class Linear(Normalizer):
    """Kernelised attention in three agreeing forms, its backends (impl.TABLE's linear entries; impl.choose):

    - `chunked` (causal, T = S): O(T) — within a chunk of `chunk_size` the masked quadratic form,
      across chunks an exclusive prefix sum of φ(K)ᵀV (flash-linear-attention's chunk form), its matmuls
      in the compute dtype with float32 accumulation;
      the backward keeps one F×H state per chunk, never one per position;
    - `bidirectional` (no causal mask): φ(Q)(φ(K)ᵀV) / φ(Q)·Σφ(K), O(T);
    - `parallel`: the masked quadratic form, O(T²) — forced by an arbitrary dense mask, a sliding
      window, causal T ≠ S or a score probe;
    - `pallas` (causal, T = S, GPU): the chunked form's numerator and denominator as fused kernels
      (pallas_linear.py), the states in registers.

    `impl`: auto (chunked once T exceeds one chunk, bidirectional without a causal mask),
    chunked (the O(T) form whenever the mask allows), parallel or pallas (asked for only). Statistics at length
    (sampled_rows.at_length) are computed on sampled_rows.stats_rows query rows, so no T×S array
    is built. Padding keys are excluded in every form by zeroing φ(k). q and k are not scaled
    (elu1 as in the paper). eps is added to the denominator (1e-6 as in idiap/fast-transformers).
    """

    exposes_scores = True  # the kernel matrix φ(Q)φ(K)ᵀ, in the parallel form

    # each feature map; favor with F = H shares compiled shapes with elu1 (F ≠ H and several chunk sizes are
    # covered by test_linear_attention_forms_agree)
    check_variants = types.MappingProxyType(
        {"elu1": {}, "relu": {"feature_map": "relu"}, "favor": {"feature_map": "favor", "num_features": 5}}
    )

    def __init__(
        self, *, num_heads, head_dim, rngs, feature_map="elu1", eps=1e-6, chunk_size=64, num_features=64, impl="auto"
    ):
        normalizer_options.linear(feature_map=feature_map, eps=eps, chunk_size=chunk_size, num_features=num_features)
        self.feature_map, self.eps, self.chunk_size = feature_map, float(eps), int(chunk_size)
        self.set_impl(impl, head_dim=head_dim)
        features = num_features if feature_map == "favor" else head_dim
        problem = pallas_linear.dim_problem("feature dim", features) if self.impl == "pallas" else None
        checks.require(problem is None, f"normalizer.impl=pallas cannot run for linear: {problem}")
        if feature_map == "favor":
            self.omega = FixedFeatures(_orthogonal_gaussian(rngs.params(), num_features, head_dim))

    def phi(self, x_BNTH, is_query: bool):
        """Feature map, computed in float32."""
        x = x_BNTH.astype(jnp.float32)
        if self.feature_map == "elu1":
            # elu(x)+1 written so it neither rounds to 0 nor explodes in its gradient (fla #1261).
            return jnp.where(x >= 0, x + 1, jnp.exp(jnp.minimum(x, 0)))
        if self.feature_map == "relu":
            return jax.nn.relu(x)
        return self._favor(x, is_query)

    def _favor(self, x_BNTH, is_query):
        # FAVOR+ positive features (Choromanski et al. 2021; google-research performer/fast_attention):
        # m^{-1/2}(exp(ωᵀx′ − ‖x′‖²/2 − c) + eps), x′ = x·d^{-1/4}.
        omega_FH = self.omega[...]
        m, d = omega_FH.shape
        xs = x_BNTH * d**-0.25
        log_BNTF = jnp.einsum("bnth,fh->bntf", xs, omega_FH) - 0.5 * jnp.sum(xs**2, -1, keepdims=True)
        if is_query:  # the per-query max is a constant of the row: it cancels in the ratio.
            log_BNTF = log_BNTF - jax.lax.stop_gradient(log_BNTF.max(-1, keepdims=True))
        # Keys need no data-dependent max (Performer's max over all positions would see the future
        # and break the recurrent form): ωᵀx − ‖x‖²/2 ≤ ‖ω‖²/2, so exp cannot overflow float32.
        return (jnp.exp(log_BNTF) + 1e-6) / math.sqrt(m)

    def _features(self, q_BNTH, k_BNSH, mask: Mask):
        qf_BNTF = self.phi(q_BNTH, True)
        kf_BNSF = self.phi(k_BNSH, False)
        if mask.key_valid_BS is not None:
            kf_BNSF = kf_BNSF * mask.key_valid_BS[:, None, :, None]
        return qf_BNTF, kf_BNSF

    def weights(self, q_BNTH, k_BNSH, mask: Mask):
        qf, kf = self._features(q_BNTH, k_BNSH, mask)
        a_BNTS = jnp.where(
            mask.matrix_B1TS(q_BNTH.shape[2], k_BNSH.shape[2]), jnp.einsum("bntf,bnsf->bnts", qf, kf), 0.0
        )
        return _divide(a_BNTS, a_BNTS.sum(-1, keepdims=True), self.eps)

    def capability(self) -> Capability:
        return Capability(linear_chunk=self.chunk_size)

    def __call__(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask, *, with_stats=False, score_probe_BNTS=None):
        B, N, T, _ = q_BNTH.shape
        S = k_BNSH.shape[2]
        backend = self.backend(T, S, mask, q_BNTH.dtype, Workload(B, N))
        if score_probe_BNTS is None:
            out_BNTH = backend.run(self, q_BNTH, k_BNSH, v_BNSH, mask)
        else:  # dL/d scores (logging steps) needs the explicit kernel matrix A = φ(Q)φ(K)ᵀ
            out_BNTH = self.parallel_call(q_BNTH, k_BNSH, v_BNSH, mask, score_probe_BNTS)
        if not with_stats:
            return out_BNTH, {}
        # At length, statistics on sampled query rows: the full T×S kernel matrix is what ran out of memory.
        qf, kf = self._features(q_BNTH, k_BNSH, mask)
        rows_R = sampled_rows.stats_rows(T) if backend.stats_rows(T, S) else None
        m_B1RS = mask.matrix_B1TS(T, S, rows_R)
        qf_rows = qf if rows_R is None else qf[:, :, rows_R]
        a_BNRS = jnp.where(m_B1RS, jnp.einsum("bnrf,bnsf->bnrs", qf_rows, kf), 0.0)
        den_BNR = a_BNRS.sum(-1)
        has_keys = jnp.broadcast_to(m_B1RS.any(-1), den_BNR.shape)
        q_pos_R = None if rows_R is None else jnp.asarray(rows_R) + (S - T)
        stats = core_stats(_divide(a_BNRS, den_BNR[..., None], self.eps), a_BNRS, m_B1RS, q_pos_R)
        stats["min_denominator"] = jnp.where(has_keys, den_BNR, jnp.inf).min((0, 2))
        return out_BNTH, stats

    def parallel_call(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask, probe_BNTS=None):
        """The output by the masked quadratic form (`probe_BNTS`: a zero array added to the kernel matrix)."""
        qf, kf = self._features(q_BNTH, k_BNSH, mask)
        a_BNTS = jnp.einsum("bntf,bnsf->bnts", qf, kf)
        if probe_BNTS is not None:
            a_BNTS = a_BNTS + probe_BNTS
        a_BNTS = jnp.where(mask.matrix_B1TS(qf.shape[2], kf.shape[2]), a_BNTS, 0.0)
        num = jnp.einsum("bnts,bnsh->bnth", a_BNTS, v_BNSH.astype(jnp.float32))
        return _divide(num, a_BNTS.sum(-1)[..., None], self.eps).astype(v_BNSH.dtype)

    def bidirectional_call(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask):
        """The output by φ(Q)(φ(K)ᵀV) / φ(Q)·Σφ(K), O(T), for a mask with no causality, window or dense part."""
        qf, kf = self._features(q_BNTH, k_BNSH, mask)
        num = jnp.einsum("bntf,bnfh->bnth", qf, jnp.einsum("bnsf,bnsh->bnfh", kf, v_BNSH.astype(jnp.float32)))
        den = jnp.einsum("bntf,bnf->bnt", qf, kf.sum(2))[..., None]
        return _divide(num, den, self.eps).astype(v_BNSH.dtype)

    def chunked_call(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask):
        """The output by the chunk form (`_chunked`), O(T), for a causal mask with T = S."""
        qf, kf = self._features(q_BNTH, k_BNSH, mask)
        num, den = self._chunked(qf, kf, v_BNSH)  # in the compute dtype: its matmuls take bfloat16
        return _divide(num, den, self.eps).astype(v_BNSH.dtype)

    def pallas_call(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask):
        """The output by the fused kernels (`_pallas`; the kernel divides: its output is what both backwards read)."""
        return self._pallas(q_BNTH, k_BNSH, v_BNSH, mask)

    def _pallas(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask, interpret: bool = False):
        """The output by the fused kernels (pallas_linear.py). The features are recomputed from q and k in the
        backward (jax.checkpoint) rather than kept: XLA fuses them into the kernel's operands, and the backward holds
        q and k for φ' anyway, so keeping φ(q), φ(k) too would add two arrays per layer. The kernel's output and
        denominator are kept (named for the checkpoint's policy): its backward reads them, and recomputing them
        would run the forward kernel again. `interpret`: the kernels as JAX operations (on a CPU)."""

        def fused(q_BNTH, k_BNSH, v_BNSH, lengths_B1):
            # Right padding is its key lengths: the checkpoint keeps those, not a (B,S) mask through the backward.
            m = (
                mask
                if lengths_B1 is None
                else mask.replace(key_valid_BS=jnp.arange(k_BNSH.shape[2])[None, :] < lengths_B1)
            )
            qf, kf = self._features(q_BNTH, k_BNSH, m)
            return pallas_linear.attention(qf, kf, v_BNSH, self.chunk_size, self.eps, interpret=interpret)

        valid = mask.key_valid_BS
        lengths_B1 = valid.sum(-1, keepdims=True) if valid is not None and mask.right_padded else None
        keep = jax.checkpoint_policies.save_only_these_names(*pallas_linear.SAVED)
        return jax.checkpoint(fused, policy=keep)(q_BNTH, k_BNSH, v_BNSH, lengths_B1)

    def _chunked(self, qf_BNTF, kf_BNTF, v_BNTH):
        """(numerator, denominator) by flash-linear-attention's chunk scheme (fla/ops/linear_attn, chunk):
        within a chunk the masked quadratic form, across chunks the state φ(K)ᵀV entering each chunk.

        The matmuls take the compute dtype (bfloat16 operands on tensor cores) and accumulate in float32;
        like fla, the intra-chunk weights and the state are rounded to it before meeting v and q. The
        denominator is computed beside, in float32, from the same weights and Σφ(k) (no column of ones on
        v: its H + 1 columns fit no tensor-core tile). The states come from a prefix sum over chunks,
        log-depth, not a scan of T/C serial steps.
        """
        B, N, T, F = qf_BNTF.shape
        C = min(self.chunk_size, T)
        pad = -T % C  # padded positions have φ(k) = 0, so they add nothing; their rows are dropped.
        K = (T + pad) // C
        dtype, acc = v_BNTH.dtype, {"preferred_element_type": jnp.float32}

        def blocks(x):  # (B,N,T,X) -> (B,N,K,C,X): every einsum batches over (b, n, k)
            return jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(B, N, K, C, -1)

        kf32 = blocks(kf_BNTF)
        qf, kf, v = blocks(qf_BNTF.astype(dtype)), kf32.astype(dtype), blocks(v_BNTH)
        s_BNKFH = _exclusive_cumsum(jnp.einsum("bnkcf,bnkch->bnkfh", kf, v, **acc), axis=2)
        z_BNKF = _exclusive_cumsum(kf32.sum(3), axis=2)
        # The weights leave their matmul rounded to the compute dtype (accumulated in float32 within it),
        # and the denominator sums those same weights: numerator and denominator see one set of weights.
        a_BNKCC = jnp.einsum("bnkcf,bnkdf->bnkcd", qf, kf, preferred_element_type=dtype)
        a_BNKCC = jnp.where(jnp.tril(jnp.ones((C, C), bool)), a_BNKCC, jnp.zeros((), dtype))
        num = jnp.einsum("bnkcd,bnkdh->bnkch", a_BNKCC, v, **acc) + jnp.einsum(
            "bnkcf,bnkfh->bnkch", qf, s_BNKFH.astype(dtype), **acc
        )
        den = a_BNKCC.astype(jnp.float32).sum(-1) + jnp.einsum("bnkcf,bnkf->bnkc", qf.astype(jnp.float32), z_BNKF)
        return num.reshape(B, N, K * C, -1)[:, :, :T], den.reshape(B, N, K * C, 1)[:, :, :T]

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        """Float64: a_ij = φ(q_i)·φ(k_j) over the admissible keys, a_ij/(Σ_j a_ij + eps); min_denominator the least
        Σ_j a_ij of a row with a key."""
        omega = np.asarray(self.omega[...], np.float64) if self.feature_map == "favor" else None
        qf = linear_features_np(q_BNTH, self.feature_map, omega, is_query=True)
        kf = linear_features_np(k_BNSH, self.feature_map, omega, is_query=False)
        a_BNTS = np.einsum("bntf,bnsf->bnts", qf, kf) * admissible_BTS[:, None]
        w = ref.rowwise(lambda r, *_: r / (r.sum() + self.eps), a_BNTS, admissible_BTS)
        return w, a_BNTS, {"min_denominator": ref.min_row_sum(a_BNTS, admissible_BTS)}


def linear_features_np(x_BNTH, feature_map, omega_FH=None, is_query=False):
    """Float64 φ: elu(x) + 1, relu(x), or FAVOR+ m^{-1/2}(exp(ωᵀx′ − ‖x′‖²/2 − c) + 1e-6), x′ = x d^{-1/4}, c the
    per-query max over features (queries), 0 (keys) (Choromanski et al. 2021)."""
    x = np.asarray(x_BNTH, np.float64)
    if feature_map == "elu1":
        return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))
    if feature_map == "relu":
        return np.maximum(x, 0)
    mF, d = omega_FH.shape
    xs = x * d**-0.25
    lg = xs @ omega_FH.T - 0.5 * (xs**2).sum(-1, keepdims=True)
    if is_query:
        lg = lg - lg.max(-1, keepdims=True)
    return (np.exp(lg) + 1e-6) / math.sqrt(mF)


def _exclusive_cumsum(x, axis: int):
    """Σ of the entries before each along `axis`: the cumulative sum shifted one place (cumsum − x would
    lose precision on long sequences). XLA:GPU makes jnp.cumsum a log-depth scan: fewer kernels and bytes
    than jax.lax.associative_scan (measured, deviceless H100), where a lax.scan is T/C serial steps."""
    before = jax.lax.slice_in_dim(jnp.cumsum(x, axis), 0, x.shape[axis] - 1, axis=axis)
    return jnp.concatenate([jax.lax.slice_in_dim(jnp.zeros_like(x), 0, 1, axis=axis), before], axis)


def _divide(num, den, eps: float):
    """num/(den + eps) for den ≥ 0 (features are ≥ 0). At eps > 0 a plain division, whose backward keeps num and den
    only (no (B,N,T) mask per layer); at eps = 0, 0 where den is 0 (a row with no admissible key), finite gradients."""
    if eps > 0:
        return num / (den + eps)
    ok = den > 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def _orthogonal_gaussian(key, m: int, d: int):
    """m×d projections from orthogonal d×d blocks with χ-distributed row norms (FAVOR+)."""
    blocks = []
    keys = jax.random.split(key, m // d + 2)
    for i in range(-(-m // d)):
        q, _ = jnp.linalg.qr(jax.random.normal(keys[i], (d, d)))
        blocks.append(q.T)
    norms = jnp.linalg.norm(jax.random.normal(keys[-1], (m, d)), axis=1, keepdims=True)
    return jnp.concatenate(blocks)[:m] * norms
