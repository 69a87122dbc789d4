"""Run the real `python -m attnlab` entry point in a subprocess and read what it left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# One persistent compilation cache for the whole suite: runs that differ only in seed, steps or
# launcher compile the same programs, so later ones load them instead of compiling again.
CACHE = Path(tempfile.gettempdir()) / "attnlab-test-jax-cache"
# Tiny sizes so a run compiles and trains in seconds.
TINY = [
    "model=tiny",
    "accelerator=cpu",
    f"compile_cache={CACHE}",
    "trainer.steps=4",
    "trainer.log_every=2",
    "trainer.eval_every=4",
    "trainer.batch_size=8",
    "trainer.eval_batch_size=20",
    "trainer.progress=none",
]
TINY_TASK = {
    "mqar": [
        "task.seq_len=16",
        "task.vocab_size=16",
        "task.num_kv_pairs=2",
        "task.n_train=200",
        "task.n_val=40",
        "task.n_test=40",
    ],
    "icl_regression": ["task.dim=3", "task.n_points=6", "task.n_train=200", "task.n_val=40", "task.n_test=40"],
    "listops": [
        "task.max_depth=2",
        "task.max_args=3",
        "task.min_length=4",
        "task.max_length=16",
        "task.seq_len=16",
        "task.n_train=200",
        "task.n_val=40",
        "task.n_test=40",
    ],
    "digits": [],
    "lm": ["task.seq_len=16", "task.n_train=200", "task.n_val=40", "task.n_test=40"],
    "max_retrieval": ["task.n_items=7", "task.min_items=3", "task.n_train=200", "task.n_val=40", "task.n_test=40"],
}


def run_cli(*overrides: str, cwd: Path, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m attnlab OVERRIDES...` with JAX on the CPU; stdout+stderr captured."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "attnlab", *overrides], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-3000:]}")
    return proc


def metrics(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def events(run_dir: Path) -> EventAccumulator:
    """TensorBoard's own reader, keeping every event (size_guidance 0 = keep all)."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "histograms": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalar_curve(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in events(run_dir).Scalars(tag)]
