"""attnlab-train's exit codes (attnlab.exits, the README's table), for a single run and a sweep alike: refused,
diverged, interrupted by a real signal (completed is every other test's exit 0)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from cli_helpers import TINY, metrics, run_cli, tiny_task

from attnlab import exits

# squared attention without eps at lr 1e6: non-finite from the first steps (tests/train/test_reliability.py).
DIVERGE = [
    *TINY,
    *tiny_task("mqar"),
    "normalizer=squared",
    "normalizer.eps=0",
    "optim.lr=1e6",
    "optim.warmup_steps=0",
    "trainer.nonfinite=stop",
]
MODES = {"single run": [], "sweep": ["-m"]}
# A sweep's refusal, divergence and start-up interrupt each take a process of their own: `-m long` runs them; the
# default suite runs every outcome as a single run, the sweep's SIGINT, and exits.of_sweep's table.
SWEEP_LONG = [pytest.param(mode, marks=[pytest.mark.long] if mode == "sweep" else []) for mode in MODES]


@pytest.mark.parametrize("mode", SWEEP_LONG)
@pytest.mark.parametrize(
    "overrides", [["normalizer=softmx"], ["model.heads=0", *TINY, *tiny_task("mqar")]], ids=["composition", "component"]
)
def test_refused(tmp_path, mode, overrides):
    """Refused by Hydra's composition or by a component's check: exit 2 either way; a sweep whose every job
    was refused exits 2 too."""
    proc = run_cli(
        *MODES[mode],
        *overrides,
        f"hydra.{'sweep' if mode == 'sweep' else 'run'}.dir={tmp_path / 'd'}",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == exits.REFUSED, proc.stderr[-2000:]
    if mode == "sweep" and overrides[0] == "model.heads=0":
        assert re.search(r"^sweep .*: 1 refused$", proc.stderr, re.M), proc.stderr[-2000:]


@pytest.mark.parametrize("mode", SWEEP_LONG)
def test_diverged(tmp_path, mode):
    proc = run_cli(
        *MODES[mode],
        *DIVERGE,
        f"hydra.{'sweep' if mode == 'sweep' else 'run'}.dir={tmp_path / 'd'}",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == exits.DIVERGED, proc.stderr[-2000:]
    assert metrics(tmp_path / "d" / ("0" if mode == "sweep" else ""))["status"] == "diverged"


def test_a_sweep_exits_with_its_most_urgent_outcome():
    assert exits.of_sweep([]) == exits.of_sweep(["completed"]) == exits.COMPLETED
    assert exits.of_sweep(["completed", "diverged"]) == exits.DIVERGED
    assert exits.of_sweep(["diverged", "refused"]) == exits.REFUSED
    assert exits.of_sweep(["refused", "failed", "diverged"]) == exits.of_sweep(["unfinished"]) == exits.FAILED
    assert exits.of_sweep(["failed", "interrupted", "completed"]) == exits.INTERRUPTED


@pytest.mark.parametrize("mode", MODES)
def test_sigint_mid_training_exits_130_at_once_with_the_resume_command(tmp_path, mode):
    """A real SIGINT to a real process in its step loop: exit 130 (never 0), the resume command printed, no
    final metrics computed for the unfinished run."""
    d = tmp_path / "d"
    args = [
        *TINY,
        *tiny_task("mqar"),
        "trainer.steps=100000",
        "trainer.checkpoint_every=5",
        f"hydra.{'sweep' if mode == 'sweep' else 'run'}.dir={d}",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", *MODES[mode], *args],
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_dir = d / "0" if mode == "sweep" else d
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "5").exists():  # training is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.05)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == exits.INTERRUPTED and "Traceback" not in out, out[-3000:]
    assert time.monotonic() - signalled < 30, "the stop waited for something"
    record = metrics(run_dir)
    assert record["status"] == "interrupted" and record["final"] == {} and "headline:" not in out
    # a sweep job's lines carry its label ("[0] ", sweep.progress), the resume command too
    assert re.search(r"^(\[[^\]]+\] )?(resume: |  ).*hydra\.(run|sweep)\.dir=", out, re.M), out[-3000:]


# A SIGTERM while jaxlib starts (the import of its MLIR bindings, which run Python called from C++), sent by the
# process itself from an import hook so that it lands there every time.
_SIGTERM_AMID_JAXLIB = """
import importlib.abc, os, signal, sys
class SignalAmidImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "jaxlib.mlir":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)
sys.meta_path.insert(0, SignalAmidImport())
from attnlab.cli import train_main
train_main()
"""


@pytest.mark.parametrize("mode", SWEEP_LONG)
def test_sigterm_during_start_up_exits_130_with_the_command_to_run_again(tmp_path, mode):
    """A signal before the first step (here: amid JAX's import) is an interrupt like any other: exit 130, no
    traceback, nothing trained, and the command that runs it again."""
    d = tmp_path / "d"
    args = [*TINY, *tiny_task("mqar"), f"hydra.{'sweep' if mode == 'sweep' else 'run'}.dir={d}"]
    proc = subprocess.run(
        [sys.executable, "-c", _SIGTERM_AMID_JAXLIB, *MODES[mode], *args],
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == exits.INTERRUPTED and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(
        r"interrupted before (it started|its first checkpoint); resume it with:\n  .*" + re.escape(args[-1]),
        proc.stderr,
    ), proc.stderr[-3000:]
    assert not (d / "0" if mode == "sweep" else d / "metrics.json").exists()
