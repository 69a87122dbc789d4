"""Suite-wide: float32 matmuls in full float32, so the suite passes on a GPU exactly as on CPU.

JAX runs float32 matmuls on NVIDIA GPUs as TF32 by default (relative error ~3e-4 on a 512×512
product), far above the tolerances of the numerics tests; CPU matmuls are float32 anyway.
Rank promotion raises (nanodo's habit): a silent broadcast of (N,) against (B,N,T,S) is a bug until
the code says which axes it means with `[None]` / `jnp.expand_dims`.
"""

import os
import re
import sys
import tempfile

import jax
import pytest

jax.config.update("jax_default_matmul_precision", "highest")
# A host-stream lm run (task.device_text_bytes, drawn by the fuzzer too) caches its text: never in the user's ~/.cache.
os.environ.setdefault("ATTNLAB_CACHE", os.path.join(tempfile.gettempdir(), "attnlab-test-cache"))
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(autouse=True)
def _float32_matmuls():
    """Restore the pin after a test that ran attnlab's CLI in-process (which sets the run's precision)."""
    yield
    jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(autouse=True)
def _programs_compiled_per_test():
    """No test runs another test's programs (attnlab.train.programs keeps them per config in a process, and a test
    may patch what a program traces)."""
    yield
    if "attnlab.train.programs" in sys.modules:  # loaded by a run: nothing to forget otherwise, nothing imported
        sys.modules["attnlab.train.programs"].clear()


def pytest_ignore_collect(collection_path, config):
    """tests/scripts/gpu_program/ is not imported where the mark expression excludes its tests (the default
    `not gpu_program`): importing it builds every normalizer to list the fused ones (~2 s of each worker)."""
    excluded = re.search(r"\bnot\s+gpu_program\b", config.option.markexpr or "")
    return True if excluded and collection_path.name == "gpu_program" else None
