"""The attention backend: one pure function, `choose`, of what a normalizer can run, what was asked and where.

The model calls it once per layer and sequence length when it is built (model.Transformer.choose_backends);
the plain step, the logging step and run.json's `attention_impl` read that recorded choice. A normalizer
used on its own (normalizers.attend, tests) makes the same call on its first trace.

`normalizer.impl` of a score normalizer: auto | cudnn | xla | blockwise | dense.
  cudnn / xla  jax.nn.dot_product_attention(implementation=...) with is_causal, key lengths and
               local_window_size, never a dense mask or bias (a mask becomes a T×S bias and loses
               cuDNN's flash kernel); softmax and KL with the uniform prior only (fused.py).
  blockwise    blockwise.py, O(T·block) memory.
  dense        the explicit T×S form (softmax: its hand-written backward, softmax_vjp.py).
  pallas       pointwise forms (sigmoid, relu) only, GPU only: fused Pallas kernels (pallas_sigmoid.py), no
               T×S array and one kernel per pass where blockwise launches a loop of small ones. Asked for, never
               chosen by auto: it is checked in interpret mode and compiled for an H100, not yet timed on one.
               Linear attention has its own (below).
  auto         cudnn where platform, dtype, head dim and mask allow; else dense while the T×S score
               tensors fit the platform's memory budget (`dense_score_bytes` ≤ `memory_budget`), blockwise
               beyond it. Never xla: with a mask XLA materialises the T×S matrix.
`normalizer.impl` of linear attention (linear.py): auto | chunked | parallel | pallas, giving the backends
  chunked (causal, T = S: O(T)), bidirectional (no causal mask: O(T)) or parallel (the masked T×S form,
  forced by a dense mask, a window or causal T ≠ S); auto is chunked once T exceeds one chunk. pallas: the
  chunked form as fused kernels (pallas_linear.py), causal with T = S and GPU only; asked for, never chosen by
  auto, as the pointwise kernels.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from attnlab import checks
from attnlab.checks import ConfigError

from . import pallas_linear, pallas_sigmoid
from .mask import Mask

SCORE_IMPLS = ("auto", "cudnn", "xla", "blockwise", "dense", "pallas")
LINEAR_IMPLS = ("auto", "chunked", "parallel", "pallas")
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
    """What a normalizer can run besides its dense form."""

    fused: bool = False  # it is softmax(βz) over the admissible keys (jax.nn.dot_product_attention computes it)
    blockwise: bool = False  # it has a blockwise.BlockForm
    linear_chunk: int = 0  # linear attention's chunk size: its forms are chunked | bidirectional | parallel
    pallas: bool = False  # it has fused Pallas kernels: a pointwise blockwise form (pallas_sigmoid), or linear


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


def allowed(capability: Capability) -> tuple[str, ...]:
    """The `normalizer.impl` values a normalizer of this capability accepts."""
    if capability.linear_chunk:
        return tuple(i for i in LINEAR_IMPLS if i != "pallas" or capability.pallas)
    return tuple(
        i
        for i in SCORE_IMPLS
        if i in ("auto", "dense")
        or (i == "blockwise" and capability.blockwise)
        or (i in ("cudnn", "xla") and capability.fused)
        or (i == "pallas" and capability.pallas)
    )


def check_block_size(block_size) -> int:
    """A validated `normalizer.block_size`."""
    return checks.integer("normalizer.block_size", block_size, 1)


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


def pallas_problem(capability: Capability, platform: str, head_dim: int | None, mask: Mask, T: int, S: int):
    """Why the normalizer's fused Pallas kernels cannot run here, or None if they can."""
    if platform != "gpu":
        return f"platform {platform} (the kernels are compiled for gpu)"
    if capability.linear_chunk:
        return pallas_linear.input_problem(head_dim, mask, T, S)
    return pallas_sigmoid.input_problem(head_dim, mask)


def linear_form(requested: str, chunk: int, mask: Mask, T: int, S: int) -> str:
    """Linear attention's form: chunked | bidirectional | parallel (`chunked` asks for the O(T) form where the
    mask allows it)."""
    if mask.has_dense or mask.window is not None or (mask.causal and T != S) or requested == "parallel":
        return "parallel"
    if not mask.causal:
        return "bidirectional"
    return "chunked" if requested == "chunked" or T > chunk else "parallel"


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
) -> str:
    """The backend a plain step runs at T queries and S keys; ConfigError (one line) if `requested` cannot run.

    dense_bytes: `dense_score_bytes` of the step; budget_bytes: `memory_budget` of the platform."""

    def refuse(why: str):
        raise ConfigError(f"normalizer.impl={requested} cannot run for {normalizer}: {why}")

    if requested not in allowed(capability):
        why = {
            "cudnn": "only softmax and kl with prior=uniform are softmax kernels",
            "xla": "only softmax and kl with prior=uniform are softmax kernels",
            "blockwise": "it has no blockwise form",
            "pallas": "only the pointwise normalizers (sigmoid, relu) and linear have Pallas kernels",
        }.get(requested, "no such implementation")
        refuse(f"{why}; allowed here: {', '.join(allowed(capability))}")
    if requested == "pallas":
        problem = pallas_problem(capability, platform, head_dim, mask, T, S)
        return "pallas" if problem is None else refuse(problem)
    if capability.linear_chunk:
        return linear_form(requested, capability.linear_chunk, mask, T, S)
    if requested == "cudnn":
        problem = cudnn_problem(platform, dtype, head_dim, mask, T, S)
        return "cudnn" if problem is None else refuse(problem)
    if requested == "xla":
        problem = fused_mask_problem(mask, T, S, cudnn=False)
        return "xla" if problem is None else refuse(f"mask: {problem}")
    if requested == "blockwise":
        if mask.dense_BNTS is not None:
            refuse("the blockwise form takes no per-head dense mask")
        return "blockwise"
    if requested == "dense":
        return "dense"
    if capability.fused and cudnn_problem(platform, dtype, head_dim, mask, T, S) is None:
        return "cudnn"
    if capability.blockwise and mask.dense_BNTS is None and dense_bytes > budget_bytes:
        return "blockwise"
    return "dense"
