"""Accelerator selection before JAX starts: platform, simulated CPU devices, dtype, compilation cache, mesh; and the
process-wide settings a run makes (matmul precision, CPU threads per parallel job)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnlab import checks
from attnlab.options import accelerator as accelerator_options
from attnlab.options.accelerator import DTYPES, MATMUL_PRECISIONS, check_options
from attnlab.platforms import INSTALL, PLATFORMS

# float32 means float32: GPUs otherwise run float32 matmuls as TF32 (rel. error ~3e-4 on a 512×512 product);
# bfloat16 compute is low precision by choice, so its matmuls keep the platform default.
MATMUL_RULE = {"float32": "highest", "bfloat16": "default"}


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """The accelerator group (its YAMLs' `_target_`), each option checked when built; `configure` applies
    platform, devices, memory fraction and distributed before JAX starts, the dtype and matmul precision follow."""

    platform: str
    devices: int | None
    dtype: str | None
    matmul_precision: str | None
    gpu_memory_fraction: float | None
    distributed: bool

    def __post_init__(self):
        accelerator_options.accelerator(
            platform=self.platform,
            devices=self.devices,
            dtype=self.dtype,
            matmul_precision=self.matmul_precision,
            gpu_memory_fraction=self.gpu_memory_fraction,
            distributed=self.distributed,
        )


def configure(
    platform: str,
    devices: int | None = None,
    cache_dir: str | None = None,
    gpu_memory_fraction: float | None = None,
    distributed: bool = False,
) -> None:
    """Set JAX's platform and device count; must run before any JAX computation."""
    check_options(platform, devices, cache_dir, gpu_memory_fraction, distributed)
    if PLATFORMS[platform]:
        jax.config.update("jax_platforms", PLATFORMS[platform])
    if devices is not None:
        jax.config.update("jax_num_cpu_devices", int(devices))
    if gpu_memory_fraction is not None:
        # Several processes on one GPU: no preallocation, each capped (JAX GPU memory docs).
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(gpu_memory_fraction)
    if distributed:
        # One run over several hosts (e.g. SLURM tasks): coordinator and ranks come from the environment.
        jax.distributed.initialize()
    if cache_dir:
        try:
            Path(cache_dir).expanduser().mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise checks.ConfigError(
                f"compile_cache={cache_dir} cannot be created ({exc.strerror or exc}); "
                f"allowed: a writable directory, or null to disable the cache"
            ) from None
        jax.config.update("jax_compilation_cache_dir", str(Path(cache_dir).expanduser()))
        # Small CPU programs fall under the default thresholds and would never be cached.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if PLATFORMS[platform]:
        check_platform(platform)


def check_platform(platform: str) -> None:
    """A ValueError in one line when JAX has no device of the asked platform: what JAX sees and how to install."""
    before = jax.config.jax_platforms
    try:
        found = len(jax.devices(PLATFORMS[platform])) > 0
    except (RuntimeError, AssertionError):  # jax 0.10: AssertionError from the backend lookup, RuntimeError else
        found = False
    if found:
        return
    jax.config.update("jax_platforms", None if before == PLATFORMS[platform] else before)
    try:
        seen = ", ".join(sorted({f"{d.platform} x{jax.device_count(d.platform)}" for d in jax.devices()}))
    except (RuntimeError, AssertionError):
        seen = "no device"
    install = INSTALL.get(platform, "")
    raise checks.ConfigError(
        f"accelerator={platform} asks for JAX platform {PLATFORMS[platform]!r}, but JAX "
        f"{jax.__version__} sees only: {seen}; allowed here: accelerator=auto or cpu"
        + (f"; to add {platform} support: {install}" if install else "")
    )


def compute_dtype(dtype: str | None):
    """float32 on CPU, bfloat16 mixed precision on GPU/TPU, unless given explicitly."""
    checks.choice("accelerator.dtype", dtype, DTYPES)
    if dtype in (None, "auto"):
        return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]


def matmul_precision(setting: str | None, dtype) -> str:
    """The matmul precision a run uses: `setting`, or the rule from the compute dtype when null."""
    checks.choice("accelerator.matmul_precision", setting, MATMUL_PRECISIONS)
    return MATMUL_RULE[jnp.dtype(dtype).name] if setting is None else setting


def apply_matmul_precision(setting: str | None, dtype) -> str:
    """Set jax_default_matmul_precision for this process (before anything compiles); returns the value set."""
    value = matmul_precision(setting, dtype)
    jax.config.update("jax_default_matmul_precision", value)
    return value


def limit_threads(launcher_target: str, n_jobs: int | None) -> None:
    """With joblib, give each of the n_jobs parallel jobs its share of the cores in the thread counts read from the
    environment (OpenMP, OpenBLAS, MKL), and ask XLA for single-threaded Eigen where the share is one core (set
    before JAX starts).

    XLA's own CPU thread pool, which runs its matmuls, still spans the cores the process may run on (BENCHMARKS.md):
    no XLA flag sizes it, and the `intra_op_parallelism_threads=N` of a common recipe is no XLA flag (after a flag
    XLA ignores it, alone it is read as a file of flags)."""
    if "joblib" not in launcher_target:
        return
    cores = os.cpu_count() or 1
    n = cores if not n_jobs or n_jobs < 0 else n_jobs
    threads = max(1, cores // n)
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'}"
    ).strip()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


def seeds_over_devices(num_seeds: int, device_count: int) -> bool:
    """Whether vmapped seeds are sharded over the devices (each trains its own seeds, no all-reduce) rather
    than every seed's batch being split; on CPU a seed's step barely uses a second thread (BENCHMARKS.md)."""
    return num_seeds > 1 and device_count > 1 and num_seeds % device_count == 0


def put(tree, sharding):
    """jax.device_put, also onto a sharding that spans processes (accelerator.distributed): every process holds
    the same host values (built from the same seeds), so each places the shards of its own devices from them."""
    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding)

    def place(x):
        if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):  # nnx Rngs' typed keys: their data
            return jax.random.wrap_key_data(place(jax.random.key_data(x)), impl=jax.random.key_impl(x))
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(place, tree)


def data_mesh():
    """A 1-D data-parallel mesh over every local device."""
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
