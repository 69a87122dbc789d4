"""The attention backends: one table (TABLE), one entry a backend, and `choose`, a pure function of what a
normalizer can run (its Capability), what was asked (`normalizer.impl`) and where (a Site).

Each entry says whether it can run for a normalizer, platform, dtype, shape and mask (its refusal message
included), how it runs, and whether it keeps a T×S matrix. The model calls `choose` once per layer and
sequence length when it is built (model.Transformer.choose_backends); the plain step, the logging step and
run.json's `attention_impl` read that recorded entry. A normalizer used on its own (attnlab.config.attend, tests)
makes the same call on its first trace. A new backend is its module and its entry here.

`normalizer.impl` of a score normalizer: auto | cudnn | xla | blockwise | dense | pallas.
  cudnn / xla  jax.nn.dot_product_attention(implementation=...) with is_causal, key lengths and
               local_window_size, never a dense mask or bias (a mask becomes a T×S bias and loses
               cuDNN's flash kernel); softmax and KL with the uniform prior only (fused.py).
  blockwise    blockwise.py, O(T·block) memory.
  dense        the explicit T×S form (softmax: its hand-written backward, softmax_vjp.py).
  pallas       pointwise forms (sigmoid, relu) only, GPU only: fused Pallas kernels (pallas_sigmoid.py), no
               T×S array and one kernel per pass where blockwise launches a loop of small ones.
  auto         cudnn where platform, dtype, head dim and mask allow; else dense while the T×S score
               tensors fit the platform's memory budget (`dense_score_bytes` ≤ `memory_budget`), blockwise
               beyond it. Never xla: with a mask XLA materialises the T×S matrix.
`normalizer.impl` of linear attention (linear.py): auto | chunked | parallel | pallas, giving the backends
  chunked (causal, T = S: O(T)), bidirectional (no causal mask: O(T)) or parallel (the masked T×S form,
  forced by a dense mask, a window or causal T ≠ S); auto is chunked once T exceeds one chunk. pallas: the
  chunked form as fused kernels (pallas_linear.py), causal with T = S and GPU only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from attnlab.checks import ConfigError

from . import pallas_linear, pallas_sigmoid, sampled_rows
from .blockwise import BlockForm
from .fused import fused_attention
from .mask import Mask

# cuDNN flash attention (jax/_src/cudnn/fused_attention_stablehlo.py, check_is_flash_attention): fp16/bf16
# inputs, head dim a multiple of 8 and ≤ 128 (≤ 256 from Hopper on; 128 is what every generation takes).
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128

# The dense form's backward keeps, per layer, the float32 scores z (ScoreNormalizer._scores) and the float32
# weights w (their own derivative and dL/dv need them): 2 × 4 bytes per score element.
DENSE_BYTES_PER_SCORE = 8
# Share of the device's memory the dense score tensors may take: the rest holds parameters, optimizer state,
# the other activations and XLA's temporaries (a fusion may hold one more T×S buffer while it runs).
BUDGET_FRACTION = 0.25
# The budget where the device does not report its memory (a CPU; a deviceless compile for a GPU):
#   gpu  a quarter of the smallest current data-centre GPU, the 40 GB A100;
#   tpu  a quarter of a v5e's 16 GiB;
#   cpu  1 GiB: host memory is rarely the limit, but beyond this XLA:CPU's blockwise form is also the faster
#        (BENCHMARKS.md, "Attention: dense vs blockwise": 0.2-0.4× the dense time at T=8192).
DEFAULT_BUDGET_BYTES = {"gpu": 10 * 2**30, "tpu": 4 * 2**30, "cpu": 2**30}


@dataclasses.dataclass(frozen=True)
class Capability:
    """What a normalizer can run besides its dense form: its forms, which each backend's `lacks` reads."""

    fused: bool = False  # it is softmax(βz) over the admissible keys (jax.nn.dot_product_attention computes it)
    form: BlockForm | None = None  # its blockwise.BlockForm (kernels of some forms read which one)
    linear_chunk: int = 0  # linear attention's chunk size: its forms are chunked | bidirectional | parallel

    @property
    def blockwise(self) -> bool:
        """Whether it has a blockwise form."""
        return self.form is not None

    @property
    def family(self) -> str:
        """Which backends its `normalizer.impl` names: LINEAR's or SCORE's."""
        return LINEAR if self.linear_chunk else SCORE


@dataclasses.dataclass(frozen=True)
class Workload:
    """What the dense form's memory depends on besides T and S."""

    batch: int  # sequences a device holds in one step (vmapped seeds included)
    heads: int
    layers: int = 1  # layers whose residuals the backward holds at once (all of them, or 1 under remat=true)


def dense_score_bytes(work: Workload, T: int, S: int) -> int:
    """Bytes of the T×S score tensors the dense form keeps for its backward: B·N·T·S·8 per layer, times layers."""
    return work.batch * work.heads * T * S * DENSE_BYTES_PER_SCORE * work.layers


def memory_budget(platform: str) -> int:
    """The bytes the dense score tensors may take on `platform`: BUDGET_FRACTION of what the device reports,
    else DEFAULT_BUDGET_BYTES (CPU memory is the host's, so a CPU always takes its default)."""
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform == platform and platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(BUDGET_FRACTION * stats["bytes_limit"])
    return DEFAULT_BUDGET_BYTES.get(platform, DEFAULT_BUDGET_BYTES["cpu"])


def fused_mask_problem(mask: Mask, T: int, S: int, cudnn: bool) -> str | None:
    """Why jax.nn.dot_product_attention cannot express `mask` without a dense mask, or None if it can."""
    if mask.dense_BNTS is not None:
        return "a per-head dense mask"
    if mask.dense_BTS is not None:
        return "an explicit (B,T,S) mask"
    if mask.key_valid_BS is not None and not mask.right_padded:
        return "padding that is not right padding (no key lengths)"
    if (mask.causal or mask.window is not None) and T != S:
        # attnlab aligns the T queries to the last keys; jax's is_causal/local_window_size to the first.
        return f"a causal or windowed mask with T={T} != S={S}"
    if cudnn and mask.window is not None and not mask.causal:
        return "a bidirectional window (cuDNN takes left windows only)"
    return None


def cudnn_problem(platform: str, dtype, head_dim: int | None, mask: Mask, T: int, S: int) -> str | None:
    """Why cuDNN flash attention cannot run here, or None if it can."""
    if platform != "gpu":
        return f"platform {platform} (cuDNN needs gpu)"
    if jnp.dtype(dtype) not in [jnp.dtype(d) for d in CUDNN_DTYPES]:
        return f"dtype {jnp.dtype(dtype).name} (cuDNN needs bfloat16 or float16: accelerator.dtype=bfloat16)"
    if head_dim is None or head_dim > CUDNN_MAX_HEAD_DIM or head_dim % 8:
        return f"head dim {head_dim} (cuDNN needs a multiple of 8, at most {CUDNN_MAX_HEAD_DIM})"
    problem = fused_mask_problem(mask, T, S, cudnn=True)
    return None if problem is None else f"mask: {problem}"


@dataclasses.dataclass(frozen=True)
class Site:
    """Where and on what a plain step runs: what a backend's refusal and `auto`'s choice read besides the
    normalizer's Capability."""

    platform: str
    dtype: Any
    head_dim: int | None
    mask: Mask
    T: int
    S: int
    over_budget: bool = False  # the dense score tensors exceed the platform's memory budget


def _always(*_) -> None:
    """No refusal: the backend runs wherever its normalizer has the form."""
    return None


@dataclasses.dataclass(frozen=True)
class Backend:
    """One way to run a normalizer's plain step: when it can run (its refusal), how, and what it keeps.

    `run(normalizer, q_BNTH, k_BNSH, v_BNSH, mask)` is the plain step's output. `lacks(capability)` says why a
    normalizer has no such form (None: it has); `problem(capability, site)` why it cannot run at a site (None: it
    can). `auto(capability, site)`: whether `normalizer.impl=auto` takes it where it can run; auto takes the first
    such backend in table order. `fallback`: the backends asked in turn, instead of a refusal, where it cannot run.
    """

    name: str  # the normalizer.impl value that asks for it and run.json's attention_impl
    family: str  # SCORE | LINEAR: whose normalizer.impl lists it (Capability.family)
    run: Callable
    keeps_scores: bool  # its plain step holds a T×S array (tests/backends/test_impl.py compiles each one to check)
    stats_rows: Callable[[int, int], bool]  # whether a logging step at (T, S) takes its statistics on sampled rows
    lacks: Callable[[Capability], str | None] = _always
    problem: Callable[[Capability, Site], str | None] = _always
    auto: Callable[[Capability, Site], bool] = lambda capability, site: False
    requestable: bool = True  # False: reached by auto or a fallback only
    fallback: tuple[str, ...] = ()
    pallas: bool = False  # a Pallas (Triton) kernel: a deviceless compile reads its GPU from the abstract mesh


SCORE, LINEAR = "score", "linear"


def _on_gpu(site: Site) -> str | None:
    return None if site.platform == "gpu" else f"platform {site.platform} (the kernels are compiled for gpu)"


def _fused_lacks(capability: Capability) -> str | None:
    return None if capability.fused else "only softmax and kl with prior=uniform are softmax kernels"


def _xla_problem(capability: Capability, site: Site) -> str | None:
    problem = fused_mask_problem(site.mask, site.T, site.S, cudnn=False)
    return None if problem is None else f"mask: {problem}"


def _linear_o_t_problem(causal: bool):
    """Why linear attention's O(T) form for a causal (chunked) or bidirectional mask cannot take the site's mask."""

    def problem(capability: Capability, site: Site) -> str | None:
        m = site.mask
        if m.has_dense or m.window is not None or m.causal != causal or (causal and site.T != site.S):
            return "the mask needs the parallel form"
        return None

    return problem


# The backends, in the order `auto` tries them and `normalizer.impl` lists them.
TABLE = (
    Backend(
        "cudnn",
        SCORE,
        run=lambda norm, q, k, v, mask: fused_attention(q, k, v, mask, norm.beta.log(), "cudnn"),
        keeps_scores=False,
        stats_rows=sampled_rows.at_length,
        lacks=_fused_lacks,
        problem=lambda capability, s: cudnn_problem(s.platform, s.dtype, s.head_dim, s.mask, s.T, s.S),
        auto=lambda capability, site: True,
    ),
    Backend(
        "xla",  # never auto: with a mask XLA materialises the T×S matrix
        SCORE,
        run=lambda norm, q, k, v, mask: fused_attention(q, k, v, mask, norm.beta.log(), "xla"),
        keeps_scores=True,  # XLA's implementation builds the T×S logits
        stats_rows=sampled_rows.at_length,
        lacks=_fused_lacks,
        problem=_xla_problem,
    ),
    Backend(
        "blockwise",
        SCORE,
        run=lambda norm, q, k, v, mask: norm.blockwise_call(q, k, v, mask),
        keeps_scores=False,
        stats_rows=lambda T, S: True,
        lacks=lambda capability: None if capability.blockwise else "it has no blockwise form",
        problem=lambda capability, site: (
            None if site.mask.dense_BNTS is None else "the blockwise form takes no per-head dense mask"
        ),
        auto=lambda capability, site: site.over_budget,
    ),
    Backend(
        "dense",
        SCORE,
        run=lambda norm, q, k, v, mask: norm.dense_call(q, k, v, mask),
        keeps_scores=True,
        stats_rows=lambda T, S: False,
        auto=lambda capability, site: True,
    ),
    Backend(
        "pallas",  # asked for, never chosen by auto: checked in interpret mode and compiled for an H100, not timed
        SCORE,
        run=lambda norm, q, k, v, mask: pallas_sigmoid.attention(norm.block_form(), q, k, v, mask, norm.block_size),
        keeps_scores=False,
        stats_rows=lambda T, S: True,
        lacks=lambda capability: (
            None
            if pallas_sigmoid.form_problem(capability.form) is None
            else "only the pointwise normalizers (sigmoid, relu) and linear have Pallas kernels"
        ),
        problem=lambda capability, s: _on_gpu(s) or pallas_sigmoid.input_problem(s.head_dim, s.mask),
        pallas=True,
    ),
    Backend(
        "chunked",  # asked for: the O(T) form wherever the mask allows it
        LINEAR,
        run=lambda norm, q, k, v, mask: norm.chunked_call(q, k, v, mask),
        keeps_scores=False,
        stats_rows=sampled_rows.at_length,
        problem=_linear_o_t_problem(causal=True),
        auto=lambda capability, site: site.T > capability.linear_chunk,
        fallback=("bidirectional", "parallel"),
    ),
    Backend(
        "bidirectional",
        LINEAR,
        run=lambda norm, q, k, v, mask: norm.bidirectional_call(q, k, v, mask),
        keeps_scores=False,
        stats_rows=sampled_rows.at_length,
        problem=_linear_o_t_problem(causal=False),
        auto=lambda capability, site: True,
        requestable=False,
    ),
    Backend(
        "parallel",
        LINEAR,
        run=lambda norm, q, k, v, mask: norm.parallel_call(q, k, v, mask),
        keeps_scores=True,
        stats_rows=sampled_rows.at_length,
        auto=lambda capability, site: True,
    ),
    Backend(
        "pallas",  # the chunked form as fused kernels; asked for, never chosen by auto
        LINEAR,
        run=lambda norm, q, k, v, mask: norm.pallas_call(q, k, v, mask),
        keeps_scores=False,
        stats_rows=sampled_rows.at_length,
        problem=lambda capability, s: _on_gpu(s) or pallas_linear.input_problem(s.head_dim, s.mask, s.T, s.S),
        pallas=True,
    ),
)


def backends(family: str) -> dict[str, Backend]:
    """{name: Backend} of a family, in table order."""
    return {b.name: b for b in TABLE if b.family == family}


def requestable(family: str | None = None) -> tuple[str, ...]:
    """Every `normalizer.impl` value of a family (of both when None), `auto` first, in table order."""
    names = (b.name for b in TABLE if b.requestable and family in (None, b.family))
    return ("auto", *dict.fromkeys(names))


def allowed(capability: Capability) -> tuple[str, ...]:
    """The `normalizer.impl` values a normalizer of this capability accepts."""
    offered = (b.name for b in backends(capability.family).values() if b.requestable and b.lacks(capability) is None)
    return ("auto", *offered)


def choose(
    requested: str,
    capability: Capability,
    *,
    normalizer: str,
    platform: str,
    dtype,
    head_dim: int | None,
    mask: Mask,
    T: int,
    S: int,
    dense_bytes: int,
    budget_bytes: int,
) -> Backend:
    """The backend a plain step runs at T queries and S keys; ConfigError (one line) if `requested` cannot run.

    dense_bytes: `dense_score_bytes` of the step; budget_bytes: `memory_budget` of the platform."""
    site = Site(platform, dtype, head_dim, mask, T, S, over_budget=dense_bytes > budget_bytes)
    table = backends(capability.family)

    def refuse(why: str):
        raise ConfigError(f"normalizer.impl={requested} cannot run for {normalizer}: {why}")

    if requested not in allowed(capability):
        asked = table.get(requested)
        why = "no such implementation" if asked is None or not asked.requestable else asked.lacks(capability)
        refuse(f"{why}; allowed here: {', '.join(allowed(capability))}")
    if requested == "auto":
        offered = [b for b in table.values() if b.lacks(capability) is None]
        return next(b for b in offered if b.auto(capability, site) and b.problem(capability, site) is None)
    asked = table[requested]
    for backend in (asked, *(table[name] for name in asked.fallback)):
        if backend.problem(capability, site) is None:
            return backend
    return refuse(asked.problem(capability, site))
