"""attnlab.accelerator's thread limits under joblib (its options' refusals: config/test_validation.py)."""

import os
import subprocess
import sys

import pytest

from attnlab.accelerator import limit_threads

JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
THREAD_VARS = ("XLA_FLAGS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@pytest.fixture
def bare_environment(monkeypatch):
    """The thread variables unset, and restored (or removed) after the test."""
    for var in THREAD_VARS:
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)


@pytest.mark.parametrize("n_jobs", [None, -1, 1, 2])
def test_joblib_jobs_get_their_share_in_flags_xla_starts_with(bare_environment, n_jobs):
    """XLA aborts on a flag it does not know, and reads a lone word without `--` as a file of flags: the flags
    limit_threads sets in an empty environment must start it."""
    limit_threads(JOBLIB, n_jobs)
    cores = os.cpu_count() or 1
    share = max(1, cores // (cores if not n_jobs or n_jobs < 0 else n_jobs))
    assert {var: os.environ[var] for var in THREAD_VARS[1:]} == dict.fromkeys(THREAD_VARS[1:], str(share))
    assert os.environ["XLA_FLAGS"] == f"--xla_cpu_multi_thread_eigen={'true' if share > 1 else 'false'}"
    code = "import jax.numpy as jnp; print(float(jnp.ones(3).sum()))"
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "3.0", proc.stderr[-2000:]


def test_other_launchers_leave_the_environment_alone(bare_environment):
    limit_threads("hydra._internal.core_plugins.basic_launcher.BasicLauncher", 2)
    assert not any(var in os.environ for var in THREAD_VARS)
