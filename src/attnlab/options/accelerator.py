"""The accelerator group's options and the top-level compile_cache (attnlab.accelerator), checked without jax."""

from __future__ import annotations

from attnlab import checks
from attnlab.platforms import PLATFORMS

DTYPES = (None, "auto", "float32", "bfloat16")
# accelerator.matmul_precision (jax_default_matmul_precision): null = the dtype's rule (accelerator.MATMUL_RULE).
MATMUL_PRECISIONS = (None, "default", "high", "highest")


def check_options(
    platform, devices=None, cache_dir=None, gpu_memory_fraction=None, distributed=False, dtype=None
) -> None:
    """Every accelerator option and compile_cache, without touching JAX (one line naming the bad one)."""
    checks.choice("accelerator.platform", platform, PLATFORMS)
    if devices is not None:
        checks.integer("accelerator.devices", devices, 1, 4096)
        if platform != "cpu":
            raise checks.ConfigError(
                f"accelerator.devices={devices} only simulates devices with accelerator=cpu; "
                f"allowed: null on {platform}"
            )
    if gpu_memory_fraction is not None:
        checks.real("accelerator.gpu_memory_fraction", gpu_memory_fraction, 0.0, 1.0, lo_open=True)
    checks.boolean("accelerator.distributed", distributed)
    checks.choice("accelerator.dtype", dtype, DTYPES)
    compile_cache(cache_dir)


def compile_cache(cache_dir) -> None:
    """The top-level compile_cache: a directory path, or null (whether it can be created is known once made)."""
    if cache_dir is not None and not isinstance(cache_dir, str):
        raise checks.ConfigError(f"compile_cache={cache_dir!r} is invalid; allowed: a directory path, or null")


def accelerator(*, platform, devices, dtype, matmul_precision, gpu_memory_fraction, distributed) -> None:
    """accelerator=<any>: attnlab.accelerator.Accelerator."""
    check_options(platform, devices, None, gpu_memory_fraction, distributed, dtype)
    checks.choice("accelerator.matmul_precision", matmul_precision, MATMUL_PRECISIONS)


DECLARED = {"attnlab.accelerator.Accelerator": (accelerator,)}
