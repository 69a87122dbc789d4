"""The normalizer contract and β (the mask is in mask.py, the statistics in statistics.py).

Shape letters: B batch, T queries, S keys, N heads, H head dim, F feature dim (linear attention).
Normalizers take heads-major operands (B,N,T,H): XLA's CPU backend runs the attention products
2.7× faster on them than on jax.nn.dot_product_attention's (B,T,N,H) (docs/DECISIONS.md).
"""

from __future__ import annotations

import dataclasses
import math
import types

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab import checks
from attnlab.backends import blockwise, sampled_rows
from attnlab.backends.impl import (
    Backend,
    Capability,
    Workload,
    allowed,
    choose,
    dense_score_bytes,
    memory_budget,
)
from attnlab.backends.mask import Mask
from attnlab.options import normalizers as normalizer_options
from attnlab.statistics import CORE_STATS, core_stats, softmax_stats  # noqa: F401 (CORE_STATS: normalizers exports it)

from .contract import check_members


class NormalizerParam(nnx.Param):
    """A parameter of a normalizer (β, priors, slopes): excluded from weight decay, logged apart."""


class FixedFeatures(nnx.Variable):
    """A non-trainable constant drawn or set once when the model is built (FAVOR+ projections, a fixed β, a layer
    index)."""


class InverseTemperature(nnx.Module):
    """β = exp(θ) per head (or shared), so β stays positive; θ is a NormalizerParam (no decay)."""

    def __init__(self, num_heads: int, head_dim: int, beta: float | None, learnable: bool, per_head: bool):
        normalizer_options.inverse_temperature(beta=beta, learnable=learnable, per_head=per_head)
        beta = 1.0 / math.sqrt(head_dim) if beta is None else float(beta)
        theta_N = jnp.full((num_heads,) if per_head else (1,), math.log(beta), jnp.float32)
        self.num_heads = num_heads
        self.theta = NormalizerParam(theta_N) if learnable else FixedFeatures(theta_N)

    def __call__(self) -> jax.Array:
        return jnp.exp(self.log())

    def log(self) -> jax.Array:
        """log β = θ, (N,)."""
        return jnp.broadcast_to(self.theta[...], (self.num_heads,))


class Normalizer(nnx.Module):
    """The contract every attention normalizer meets.

    Built as `cls(num_heads=N, head_dim=H, rngs=rngs, **options)`, where the options are exactly
    the keys of its YAML in configs/normalizer/. Then

        out_BNTH, stats = normalizer(q_BNTH, k_BNSH, v_BNSH, mask, with_stats=False)

    maps heads-major queries, keys, values and the admissible `Mask` (causal ∧ not padding) to the attended
    output. `stats` is {} unless `with_stats`; then it holds per-head (N,) arrays with the
    CORE_STATS keys (the same for every normalizer) plus the normalizer's extras (β, KL to the
    prior, minimum denominator, ...). Computing statistics may materialise the T×S matrix;
    training without them keeps each normalizer's own asymptotic cost (O(T) for linear).

        att_BNTS = normalizer.weights(q_BNTH, k_BNSH, mask)

    returns the explicit attention matrix, for diagnostics and tests. Padding keys always get
    weight 0; a row with no admissible key gets all zeros. The public `attend` and
    `attention_weights` take jax.nn.dot_product_attention's (B,T,N,H) and transpose at that boundary.
    A concrete subclass that leaves a member unimplemented is refused when it is defined
    (contract.check_members); a base class declared `abstract=True` (ScoreNormalizer) is exempt.

    A normalizer whose output differs between training and evaluation (softmax's adaptive
    temperature) sets `mode_dependent`; attention then passes `training=` (not deterministic) to
    its `__call__`. `weights` describes it at evaluation.

    A normalizer whose gates are projected from the layer's input (forgetting attention) sets `takes_layer_input`;
    attention then passes `layer_input_BTD=` to its `__call__` and `weights`.

    A normalizer whose `__call__` takes `score_probe_BNTS` (a zero array added to its score matrix, whose
    gradient the trainer logs as score_grad) sets `exposes_scores`; one with no score matrix leaves it False.

    A normalizer whose weights may be negative (differential attention: a difference of two softmaxes) sets
    `signed_weights`: the contract checker then asks for no non-negativity, and the statistics defined for
    non-negative weights only (entropy) come from its `normalize` extras. A normalizer whose constants depend on its
    layer (differential attention's λ_init) sets `takes_layer_index`; the model calls `set_layer_index(i)` (0-based)
    once it is built. A normalizer that splits q and k into `qk_split` equal parts of the head dimension (one score
    map each; the rest of an odd dimension in none) has RoPE rotate each part on its own (attention.rope).
    """

    mode_dependent = False
    exposes_scores = False
    takes_layer_input = False  # True: attention passes layer_input_BTD= (its normalised input) to __call__, weights
    signed_weights = False  # True: weights may be negative (their entropy is the normalizer's own, in its extras)
    takes_layer_index = False  # True: the model calls set_layer_index(i) (0-based) after building layer i
    qk_split = 1  # q and k split into this many equal parts along the head dimension, a score map each
    impl, head_dim = "dense", None  # the requested normalizer.impl; head dim (cuDNN's limits): set_impl
    backends = ()  # ((T, S, impl.Backend), ...): chosen when the model was built (record_backends)
    # {variant: options over the YAML's} the tests check the normalizer under: the code paths its options select (a
    # prior, a feature map, a cap); a class that declares none is checked at its YAML defaults.
    check_variants = types.MappingProxyType({"default": {}})

    def __init_subclass__(cls, abstract: bool = False, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.abstract_base = abstract  # a base to subclass (ScoreNormalizer), no normalizer a config may build
        if not abstract:
            check_members(cls, Normalizer, ScoreNormalizer)

    def __call__(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask, *, with_stats: bool = False):
        raise NotImplementedError

    def capability(self) -> Capability:
        """What this normalizer can run besides its dense form."""
        return Capability()

    def set_impl(self, requested, block_size: int | None = None, head_dim: int | None = None) -> None:
        """Validate and keep `normalizer.impl`, and `normalizer.block_size` where the normalizer has blocks
        (head_dim: for cuDNN's limits)."""
        self.impl = checks.choice("normalizer.impl", requested, allowed(self.capability()))
        self.head_dim = head_dim
        if block_size is not None:
            normalizer_options.block_size(block_size=block_size)
            self.block_size = block_size

    def choose_backend(self, T: int, S: int, mask: Mask, dtype, workload: Workload) -> Backend:
        """impl.choose for this normalizer on the default platform; ConfigError if its impl cannot run there."""
        platform = jax.default_backend()
        return choose(
            self.impl,
            self.capability(),
            normalizer=getattr(self, "config_name", type(self).__name__),  # set by attnlab.config when built from YAML
            platform=platform,
            dtype=dtype,
            head_dim=self.head_dim,
            mask=mask,
            T=T,
            S=S,
            dense_bytes=dense_score_bytes(workload, T, S),
            budget_bytes=memory_budget(platform),
        )

    def record_backends(self, lengths, mask_of, dtype, workload: Workload) -> None:
        """Choose, once, the backend at each sequence length (T = S) of `lengths`; mask_of(T): the model's mask."""
        self.backends = tuple((T, T, self.choose_backend(T, T, mask_of(T), dtype, workload)) for T in lengths)

    def backend(self, T: int, S: int, mask: Mask, dtype, workload: Workload | None = None) -> Backend:
        """The backend of a plain step at T queries, S keys (run.json: attention_impl, its name): the one recorded
        when the model was built, else chosen now for `workload` (a normalizer used on its own; one sequence)."""
        for t, s, chosen in self.backends:
            if (t, s) == (T, S):
                return chosen
        return self.choose_backend(T, S, mask, dtype, workload or Workload(batch=1, heads=1))

    def weights(self, q_BNTH, k_BNSH, mask: Mask):
        raise NotImplementedError

    def set_layer_index(self, index: int) -> None:
        """Told the (0-based) index of its layer by the model, where the class says `takes_layer_index`."""
        raise NotImplementedError


class ScoreNormalizer(Normalizer, abstract=True):
    """A normalizer that is a function of the score matrix z = q·kᵀ (every one but linear).

    Subclasses implement `normalize(z_BNTS, m_B1TS) -> (att_BNTS, logits_BNTS, extras)`, where
    logits are the scaled scores the normalizer acts on (for max |logit|). `score_probe_BNTS`,
    a zero array added to z, lets the trainer read dL/dz (the gradient at the normalizer input).
    A plain step runs the backend `backend` names (backends/impl.py); a step with statistics or a
    score probe runs the dense form (the plain step's output and sampled rows where that keeps no T×S matrix).
    A normalizer whose weights are a row softmax of logits x says so by `softmax_rows` (x, logits, extras): its
    sampled-row statistics then come from x by `softmax_stats`, with no weights array.
    """

    block_size = 512  # set_impl
    exposes_scores = True
    softcap = None  # set_softcap

    def __init__(
        self,
        *,
        num_heads,
        head_dim,
        rngs,
        beta=None,
        learnable=True,
        per_head=True,
        impl="auto",
        block_size=512,
        softcap=None,
    ):
        """The options every scored normalizer shares: β (`beta`: its value, null for 1/√d; `learnable`;
        `per_head`), the backend (`impl`, `block_size`) and the soft cap. A subclass declares only its own options,
        passes the rest on as **shared, and sets its own state first: the backend choice reads it (`capability`).
        attnlab.config reads a subclass's options as its own keywords and these (construct.options_of)."""
        del rngs  # drawn by the subclasses that have random parameters
        self.beta = InverseTemperature(num_heads, self.score_dim(head_dim), beta, learnable, per_head)
        self.set_softcap(softcap)
        self.set_impl(impl, block_size, head_dim)

    def score_dim(self, head_dim: int) -> int:
        """d of the dot products z = q·k that β scales (its default 1/√d): the head dim, unless a subclass splits it."""
        return head_dim

    def set_softcap(self, softcap) -> None:
        """Keep `normalizer.softcap` c (null: off); call it before set_impl, which asks `capability`."""
        normalizer_options.softcap(softcap=softcap)
        self.softcap = None if softcap is None else float(softcap)

    def score_scale(self):
        """β (N,), the scale of the scaled scores βz that the soft cap bounds."""
        return self.beta()

    def capped_scores(self, z_BNTS, beta_N):
        """z ↦ (c/β)·tanh(βz/c), so the normalizer's βz becomes c·tanh(βz/c): Gemma 2's attention-logit soft cap
        (Gemma Team 2024, "Gemma 2", §2; google-deepmind/gemma modules.py), on βz before any bias or prior."""
        if self.softcap is None:
            return z_BNTS
        b_N = jnp.asarray(beta_N, jnp.float32)[None, :, None, None]
        return (self.softcap / b_N) * jnp.tanh(b_N * z_BNTS / self.softcap)

    def capped(self, form):
        """A normalizer's blockwise form with the soft cap on its scores (every `block_form` returns it through
        this); a form with its own block function (stick-breaking's ignores `logits`) has none under a cap."""
        if form is None or self.softcap is None:
            return form
        if form.make is not None:
            return None

        def logits(p, z, q_pos, k_pos, n):
            # β from the differentiated parameters where the form has them (SSMax's fixed scale otherwise).
            return form.logits(
                p, self.capped_scores(z, p["beta"] if "beta" in p else self.score_scale()), q_pos, k_pos, n
            )

        return dataclasses.replace(form, logits=logits, softcap=self.softcap)

    def normalize(self, z_BNTS, m_B1TS):
        raise NotImplementedError

    def normalize_rows(self, z_BNRS, m_B1RS, q_pos_R):
        """`normalize` on a subset of query rows at positions q_pos_R (for sampled statistics)."""
        return self.normalize(z_BNRS, m_B1RS)

    def softmax_rows(self, z_BNRS, m_B1RS, q_pos_R):
        """(x, logits, extras) where `normalize_rows` is masked_softmax(x) with those logits and extras (the
        sampled-row statistics then come from x by softmax_stats), else None."""
        return None

    def block_form(self):
        """The elementwise piece for blockwise attention (blockwise.BlockForm), or None: dense only."""
        return None

    def capability(self) -> Capability:
        return Capability(form=self.block_form())

    def blockwise_call(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask):
        """The attended output by the blockwise form (impl.TABLE's blockwise backend runs it)."""
        return blockwise.attention(self.block_form(), q_BNTH, k_BNSH, v_BNSH, mask, self.block_size)

    def plain_call(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask):
        """The attended output of a plain step, by its backend (impl.TABLE)."""
        B, N, T, _ = q_BNTH.shape
        backend = self.backend(T, k_BNSH.shape[2], mask, q_BNTH.dtype, Workload(B, N))
        return backend.run(self, q_BNTH, k_BNSH, v_BNSH, mask)

    def dense_call(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask):
        """The dense form's output (softmax overrides it with its hand-written backward)."""
        return self._dense(q_BNTH, k_BNSH, v_BNSH, mask, False, None)[0]

    def _row_stats(self, q_BNTH, k_BNSH, mask: Mask):
        """Statistics on sampled_rows.stats_rows evenly spaced query rows: no T×S array at length."""
        T, S = q_BNTH.shape[2], k_BNSH.shape[2]
        rows_R = sampled_rows.stats_rows(T)
        m_B1RS = mask.matrix_B1TS(T, S, rows_R)
        z_BNRS, q_pos_R = self._scores(q_BNTH[:, :, rows_R], k_BNSH), jnp.asarray(rows_R) + (S - T)
        softmax_rows = self.softmax_rows(z_BNRS, m_B1RS, q_pos_R)
        if softmax_rows is not None:
            x_BNRS, logits_BNRS, extras = softmax_rows
            return {**softmax_stats(x_BNRS, logits_BNRS, m_B1RS, q_pos_R), **extras}
        att_BNRS, logits_BNRS, extras = self.normalize_rows(z_BNRS, m_B1RS, q_pos_R)
        return {**core_stats(att_BNRS, logits_BNRS, m_B1RS, q_pos_R), **extras}

    def _scores(self, q_BNTH, k_BNSH):
        # Normalizer math in float32 even under bfloat16 compute (softmax-in-fp32 practice).
        z_BNTS = jnp.einsum("bnth,bnsh->bnts", q_BNTH, k_BNSH, preferred_element_type=jnp.float32)
        return z_BNTS if self.softcap is None else self.capped_scores(z_BNTS, self.score_scale())

    def weights(self, q_BNTH, k_BNSH, mask: Mask):
        m_B1TS = mask.matrix_B1TS(q_BNTH.shape[2], k_BNSH.shape[2])
        return self.normalize(self._scores(q_BNTH, k_BNSH), m_B1TS)[0]

    def __call__(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask, *, with_stats=False, score_probe_BNTS=None):
        if not with_stats and score_probe_BNTS is None:
            return self.plain_call(q_BNTH, k_BNSH, v_BNSH, mask), {}
        B, N, T, _ = q_BNTH.shape
        S = k_BNSH.shape[2]
        if score_probe_BNTS is None and mask.dense_BNTS is None:  # a probe or a per-head mask: the dense form
            backend = self.backend(T, S, mask, q_BNTH.dtype, Workload(B, N))
            if backend.stats_rows(T, S):
                # Statistics on sampled rows where the backend says so (blockwise and the Pallas kernels always, the
                # fused kernels at length); the output by the plain step's own backend (cuDNN's flash kernel).
                return backend.run(self, q_BNTH, k_BNSH, v_BNSH, mask), self._row_stats(q_BNTH, k_BNSH, mask)
        return self._dense(q_BNTH, k_BNSH, v_BNSH, mask, with_stats, score_probe_BNTS)

    def _dense(self, q_BNTH, k_BNSH, v_BNSH, mask: Mask, with_stats: bool, score_probe_BNTS, normalize=None):
        """(out, stats) of the explicit T×S form, by `normalize` (default: self.normalize)."""
        m_B1TS = mask.matrix_B1TS(q_BNTH.shape[2], k_BNSH.shape[2])
        z_BNTS = self._scores(q_BNTH, k_BNSH)
        if score_probe_BNTS is not None:
            z_BNTS = z_BNTS + score_probe_BNTS
        att_BNTS, logits_BNTS, extras = (normalize or self.normalize)(z_BNTS, m_B1TS)
        out_BNTH = jnp.einsum("bnts,bnsh->bnth", att_BNTS.astype(v_BNSH.dtype), v_BNSH)
        if not with_stats:
            return out_BNTH, {}
        return out_BNTH, {**core_stats(att_BNTS, logits_BNTS, m_B1TS), **extras}
