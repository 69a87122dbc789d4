"""What the GPU-program tests share (tests/scripts/gpu_program/): the sizes they compile at and the
normalizers' capabilities on the H100 target (scripts/gpu_program.py).

The structure tests use model=base cut to 2 layers at B=2, T=1024 (statistics on sampled rows, two key blocks): the
full-size program's structure at a compile cost 2 cores can pay. The ratio targets hold at a size, not in general
(the statistics program's share grows with B and the layers), so they are tested at two fixed sizes, model=base at
B=32, T=1024 and (the plain step against the reference) at B=4, T=8192; the rest of the B=4, T=8192 figures are the
script's table in BENCHMARKS.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gpu_program as gp  # noqa: E402, F401 — re-exported for the tests
import normalizer_refs as R  # noqa: E402

from attnlab import config  # noqa: E402
from attnlab.backends import impl  # noqa: E402

B, T, LAYERS = 2, 1024, 2
EXTRA = (f"model.layers={LAYERS}",)
FULL = (32, T)  # (B, T) of model=base with all 8 layers
LONG = (4, 8192)
HEADS, HEAD_DIM = 8, 64  # model=base


def capability(name: str, **options) -> impl.Capability:
    """What normalizer `name` with these options can run besides its dense form (backends/impl.py)."""
    return config.normalizer(name, num_heads=HEADS, head_dim=HEAD_DIM, **options).capability()


def fused_variants() -> dict[str, tuple[str, ...]]:
    """{normalizer: its overrides}: the first option variant (normalizer_refs.cases) of each registered normalizer
    that cuDNN flash attention computes (softmax with its defaults; kl with its uniform prior, its default recency
    prior being a bias)."""
    fused = {}
    for name, _, options in R.cases():
        if name not in fused and capability(name, **options).fused:
            fused[name] = tuple(f"normalizer.{key}={value}" for key, value in options.items())
    return fused


FUSED_EXTRA = fused_variants()
FUSED = list(FUSED_EXTRA)
