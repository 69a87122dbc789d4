#!/usr/bin/env python
"""The plain step of the normalizers with fused Pallas kernels, beside their other forms: compiled for a GPU
without one (scripts/gpu_program.py's compile, counting and table).

Each row is a run's step at one of the `normalizer.impl` values the normalizer accepts (backends/impl.py's
table: the pointwise normalizers at dense|blockwise|pallas, linear at chunked|parallel|pallas, softmax at
cudnn|xla|blockwise|dense). The kernels are custom calls to XLA's cost analysis: their bytes are their operands
and results, as gpu_program.py counts cuDNN's.

    JAX_PLATFORMS=cpu python scripts/pallas_program.py [--target h100] [--shapes 4x8192] [--normalizers sigmoid,relu]
    JAX_PLATFORMS=cpu python scripts/pallas_program.py --normalizers linear,softmax
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys

import gpu_program as gp
import jax

from attnlab import config
from attnlab.backends import impl as backends


def impls(name: str) -> tuple[str, ...]:
    """The `normalizer.impl` values normalizer `name` accepts besides auto (impl.allowed)."""
    return backends.allowed(config.normalizer(name, num_heads=1, head_dim=64).capability())[1:]


def program(mesh, model: str, B: int, T: int, name: str, impl: str, extra: tuple = ()):
    """(plain, logging) Programs of `name` under `impl` (a value of `impls(name)`)."""
    overrides = gp.run_overrides(model, B, T, name, 1, (f"normalizer.impl={impl}",) + extra)
    family = config.normalizer(name, num_heads=1, head_dim=64).capability().family
    # jax ≥ 0.12 reads the kernels' Triton target from the abstract mesh's device when no GPU is attached.
    pallas = backends.backends(family)[impl].pallas
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if pallas else contextlib.nullcontext():
        p = gp.attnlab_programs(mesh, overrides)
    plain = gp.Program.of(p["plain"], T)
    return plain, gp.Program.of(p["stats"], T) + plain


def row(mesh, model: str, B: int, T: int, name: str, impl: str, extra: tuple = ()):
    """(label, plain, logging, impl): a row of gpu_program.py's table."""
    return (f"{name} impl={impl}", *program(mesh, model, B, T, name, impl, extra), impl)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="h100", choices=sorted(gp.TARGETS))
    p.add_argument("--shapes", default="4x8192", help="BxT, comma-separated")
    p.add_argument("--normalizers", default="sigmoid,relu")
    p.add_argument("--model", default="base")
    p.add_argument("--override", action="append", default=[], help="a further attnlab-train override (repeatable)")
    args = p.parse_args(argv)
    gp.check_plugin()
    lines = []
    for shape in args.shapes.split(","):
        B, T = (int(x) for x in shape.lower().split("x"))
        rows = []
        with gp.on_target(args.target) as mesh:
            ref_overrides = gp.run_overrides(args.model, B, T, "softmax", 1, tuple(args.override))
            rows.append(
                (
                    "hand-written reference",
                    gp.Program.of(gp.reference_program(mesh, B, T, ref_overrides), T),
                    None,
                    "cudnn",
                )
            )
            for name in args.normalizers.split(","):
                for impl in impls(name):
                    label = f"{name} impl={impl}"
                    build = functools.partial(row, mesh, args.model, B, T, name, impl, tuple(args.override))
                    rows.append(gp.compile_row(label, build))
                    print(f"  B={B} T={T} {label}: {rows[-1][3]}", file=sys.stderr, flush=True)
        lines += gp.table_lines(args.target, B, T, rows) + [""]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
