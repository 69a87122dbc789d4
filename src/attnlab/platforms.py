"""What each accelerator platform needs beside jax, known without importing jax: attnlab-train refuses a command
whose runs ask for a platform this environment cannot give JAX before jax loads, and before any job starts."""

from __future__ import annotations

import importlib.metadata
import importlib.util

PLATFORMS = {"auto": None, "cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}
JAX_VERSION = importlib.metadata.version("jax")
# How to get the JAX wheels of each platform for the installed jax (its extras cuda12, cuda13, tpu).
INSTALL = {
    "gpu": "pip install 'attnlab[cuda]' (CUDA 12 wheels, = jax[cuda12]; 'attnlab[cuda13]' for CUDA 13)",
    "tpu": "pip install 'jax[tpu]==%s' on a Cloud TPU VM" % JAX_VERSION,
}
# The modules JAX finds a platform's devices through (its jax_plugins, or libtpu).
PLATFORM_MODULES = {
    "gpu": ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13", "jax_cuda12_plugin", "jax_cuda13_plugin"),
    "tpu": ("libtpu",),
}


def platform_installed(platform: str) -> bool:
    """Whether this environment can give JAX a device of `platform` at all (auto and cpu: always), found without
    starting a backend: a parent process that started CUDA would hold GPU memory its sweep's jobs need."""

    def found(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # the parent package (jax_plugins) is missing
            return False

    return platform not in PLATFORM_MODULES or any(found(m) for m in PLATFORM_MODULES[platform])


def absent_platform(platform: str, command: str) -> str:
    """The one line refusing `command`, whose runs ask for a platform this environment has no JAX support for."""
    return (
        f"accelerator={platform} asks for JAX platform {PLATFORMS[platform]!r}, but JAX {JAX_VERSION} has no "
        f"{platform} support installed (it sees only: cpu), so every run would fail; run it on a {platform.upper()} "
        f"machine: {command}; to add {platform} support: {INSTALL[platform]}; or here, with accelerator=cpu appended"
    )
