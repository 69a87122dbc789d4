"""Suite-wide: float32 matmuls in full float32, so the suite passes on a GPU exactly as on CPU.

JAX runs float32 matmuls on NVIDIA GPUs as TF32 by default (relative error ~3e-4 on a 512×512
product), far above the tolerances of the numerics tests; CPU matmuls are float32 anyway.
Rank promotion raises (nanodo's habit): a silent broadcast of (N,) against (B,N,T,S) is a bug until
the code says which axes it means with `[None]` / `jnp.expand_dims`.
"""

import os
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


def pytest_collection_modifyitems(config, items):
    """A test module whose tests share a module-scoped fixture (a trained run, a sweep, a wheel) runs on one xdist
    worker (`--dist loadgroup`): the fixture is built once, not once on each worker."""
    for item in items:
        if any(defs[-1].scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
