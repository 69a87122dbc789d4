"""The H100 target and the train steps compiled for it, once per test module (tests/gpu_programs.py)."""

from __future__ import annotations

import pytest
from gpu_programs import EXTRA, B, T, gp


@pytest.fixture(scope="module")
def mesh():
    with gp.on_target("h100") as m:
        yield m


@pytest.fixture(scope="module")
def programs(mesh):
    """(name, seeds, extra overrides, full size) -> {"plain", "stats": Program, "impl"}, compiled once per
    module; name "reference" is the hand-written step, "reference with its math" that step with attnlab's β and
    gradient clipping. `full`: None for the 2-layer cut at (B, T), else model=base's (batch, length)."""
    cache = {}

    def get(key: str, seeds: int = 1, extra: tuple = (), full: tuple | None = None):
        if (key, seeds, extra, full) not in cache:
            (batch, length), base = (full, ()) if full else ((B, T), EXTRA)
            overrides = gp.run_overrides(
                "base", batch, length, "softmax" if key.startswith("reference") else key, seeds, base + extra
            )
            if key.startswith("reference"):
                compiled = gp.reference_program(mesh, batch, length, overrides, same_math=key != "reference")
                cache[key, seeds, extra, full] = {"plain": gp.Program.of(compiled, length)}
            else:
                p = gp.attnlab_programs(mesh, overrides)
                cache[key, seeds, extra, full] = {
                    "plain": gp.Program.of(p["plain"], length),
                    "stats": gp.Program.of(p["stats"], length),
                    "impl": p["impl"],
                }
        return cache[key, seeds, extra, full]

    return get
