"""Throughput as papers quote it: tokens per second and model FLOP utilisation (MFU).

A token costs 6·N + 12·L·T·D FLOPs to train on (Chowdhery et al. 2022, PaLM, Appendix B: forward and backward of
the N parameters' matmuls, plus the attention scores and their weighted sum over a context of T; causal masking is not
discounted, as there), N the parameters outside the lookup tables (token and position embeddings: a gather, no
matmul; Kaplan et al. 2020's non-embedding count). MFU is those FLOPs per second over the devices' dense bfloat16
peak (PEAK_TFLOPS); None where the device is not in the table (every CPU).
"""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx

# Dense (no sparsity) bfloat16 peak TFLOP/s per device, from the vendors' data sheets, by a part of jax's
# device_kind; the first match wins, so a more specific name comes before the name it contains.
PEAK_TFLOPS = (
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("TPU v4", 275.0),
    ("TPU v5 lite", 197.0),
    ("TPU v5", 459.0),
    ("TPU v6 lite", 918.0),
)


def peak_tflops(device_kind: str) -> float | None:
    """The dense bfloat16 peak of one device of this kind, or None (a CPU, or a device not in PEAK_TFLOPS)."""
    return next((peak for part, peak in PEAK_TFLOPS if part in device_kind), None)


def parameter_counts(net: nnx.Module) -> dict[str, int]:
    """{"total", "non_embedding"}: every parameter of one seed's net, and those outside its lookup tables."""
    total = sum(x.size for x in jax.tree.leaves(nnx.state(net, nnx.Param)))
    tables = [m for _, m in nnx.iter_modules(net) if isinstance(m, nnx.Embed)]
    lookup = sum(m.embedding.size for m in tables)
    return {"total": int(total), "non_embedding": int(total - lookup)}


def flops_per_token(params: int, layers: int, seq_len: int, d_model: int) -> int:
    """PaLM's training FLOPs per token, 6·N + 12·L·T·D (module docstring)."""
    return 6 * params + 12 * layers * seq_len * d_model


@dataclasses.dataclass(frozen=True)
class Throughput:
    """What a step trains on and what that costs: tokens per step (every seed's), FLOPs per token, the peak."""

    tokens_per_step: int
    flops_per_token: int
    peak_flops: float | None  # all devices together, FLOP/s
    params: dict[str, int]

    @classmethod
    def of(cls, net: nnx.Module, *, batch_size: int, seq_len: int, seeds: int, devices: list) -> "Throughput":
        params = parameter_counts(net)
        layers, d_model = len(net.body.blocks), net.body.blocks[0].attn.qkv.in_features
        flops = flops_per_token(params["non_embedding"], layers, seq_len, d_model)
        peaks = [peak_tflops(d.device_kind) for d in devices]
        peak = None if None in peaks else sum(peaks) * 1e12
        return cls(batch_size * seq_len * seeds, flops, peak, params)

    def rates(self, steps_per_sec: float) -> dict[str, float | None]:
        """{"tokens_per_sec", "mfu"} at this many steps per second; mfu None without a known peak."""
        tokens = steps_per_sec * self.tokens_per_step
        mfu = None if self.peak_flops is None else tokens * self.flops_per_token / self.peak_flops
        return {"tokens_per_sec": tokens, "mfu": mfu}
