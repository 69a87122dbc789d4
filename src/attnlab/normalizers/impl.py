"""Which attention implementation a plain step runs: one pure function of what it is asked and what allows it.

`normalizer.impl`: auto | cudnn | xla | blockwise | dense.
  cudnn / xla  jax.nn.dot_product_attention(implementation=...) with is_causal, key lengths and
               local_window_size, never a dense mask or bias (a mask becomes a T×S bias and loses
               cuDNN's flash kernel); softmax and KL with the uniform prior only.
  blockwise    normalizers/blockwise.py, O(T·block) memory.
  dense        the explicit T×S form (softmax: its hand-written backward, softmax_vjp.py).
  auto         cudnn where platform, dtype, head dim and mask allow; else blockwise once
               T·S ≥ long_context.AUTO_MIN_TS (on every platform); else dense. Never xla: with a
               mask XLA materialises the T×S matrix, which blockwise avoids above the threshold.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from attnlab.checks import ConfigError

from .mask import Mask

IMPLS = ("auto", "cudnn", "xla", "blockwise", "dense")
# cuDNN flash attention (jax/_src/cudnn/fused_attention_stablehlo.py, check_is_flash_attention): fp16/bf16
# inputs, head dim a multiple of 8 and ≤ 128 (≤ 256 from Hopper on; 128 is what every generation takes).
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128


@dataclasses.dataclass(frozen=True)
class Capability:
    """What a normalizer can run besides its dense form."""

    fused: bool  # it is softmax(βz) over the admissible keys (jax.nn.dot_product_attention computes it)
    blockwise: bool  # it has a blockwise.BlockForm


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
) -> str:
    """The implementation a plain step runs: cudnn | xla | blockwise | dense; ValueError if `requested` cannot run."""
    from .long_context import AUTO_MIN_TS

    def refuse(why: str):
        raise ConfigError(f"normalizer.impl={requested} cannot run for {normalizer}: {why}")

    if requested in ("cudnn", "xla") and not capability.fused:
        refuse(
            "only softmax and kl with prior=uniform are softmax kernels; allowed here: "
            + ", ".join(allowed(capability))
        )
    if requested == "cudnn":
        problem = cudnn_problem(platform, dtype, head_dim, mask, T, S)
        return "cudnn" if problem is None else refuse(problem)
    if requested == "xla":
        problem = fused_mask_problem(mask, T, S, cudnn=False)
        return "xla" if problem is None else refuse(f"mask: {problem}")
    if requested == "blockwise":
        if not capability.blockwise:
            refuse("it has no blockwise form; allowed here: " + ", ".join(allowed(capability)))
        if mask.dense_BNTS is not None:
            refuse("the blockwise form takes no per-head dense mask")
        return "blockwise"
    if requested == "dense":
        return "dense"
    if capability.fused and cudnn_problem(platform, dtype, head_dim, mask, T, S) is None:
        return "cudnn"
    if capability.blockwise and mask.dense_BNTS is None and T * S >= AUTO_MIN_TS:
        return "blockwise"
    return "dense"


def allowed(capability: Capability) -> tuple[str, ...]:
    """The impl values a normalizer of this capability accepts."""
    return tuple(
        i
        for i in IMPLS
        if i in ("auto", "dense")
        or (i == "blockwise" and capability.blockwise)
        or (i in ("cudnn", "xla") and capability.fused)
    )
