"""Run the real `attnlab-train` entry point, in a subprocess or in this process, and read what it left behind."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
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
# Split sizes of a tiny run, for every task that has these options.
TINY_SPLITS = {"n_train": 200, "n_val": 40, "n_test": 40}


def tiny_task(name: str) -> list[str]:
    """Overrides that make task `name` tiny: its class's own `tiny_options`, and TINY_SPLITS where it has them."""
    from attnlab.config import registry

    options = registry.load("task", name)
    cls = registry.resolve_target(options["_target_"], "task")
    splits = {key: size for key, size in TINY_SPLITS.items() if key in options}
    return [f"task.{key}={value}" for key, value in {**cls.tiny_options, **splits}.items()]


def run_cli(*overrides: str, cwd: Path, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m attnlab OVERRIDES...` with JAX on the CPU; stdout+stderr captured."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "attnlab", *overrides], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-3000:]}")
    return proc


def train_in_process(*overrides: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """`attnlab-train OVERRIDES...` called in this process (attnlab.cli.train_main, the console script's own
    function), stdout and stderr captured: what `run_cli` checks, without a process's start-up (a fresh import of
    jax, and its compilations held in memory); for tests where starting a process is not what is tested. The
    process-wide state a run sets (signal handlers, the search path, the precision, logging) is restored after."""
    from hydra.core.global_hydra import GlobalHydra

    from attnlab import cli
    from attnlab.config import registry
    from attnlab.sweep import signals

    saved_signals = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    saved = (list(sys.argv), os.getcwd(), sys.unraisablehook, list(registry._EXTRA), dict(signals.RUN))
    saved_jax = {k: getattr(jax.config, k) for k in ("jax_default_matmul_precision", "jax_compilation_cache_dir")}
    root = logging.getLogger()
    saved_logging = (list(root.handlers), root.level)
    # Hydra configures logging through logging.config.dictConfig, which closes every handler made so far
    # (logging.shutdown over logging._handlerList), pytest's log-capturing file handler among them: hidden here.
    handlers_made = logging._handlerList[:]
    del logging._handlerList[:]
    # A test may hold Hydra's compose API open (initialize_config_dir), whose global state a run refuses to share.
    composing = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["attnlab-train", *overrides]
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.train_main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if not isinstance(exc.code, int | None):
                    print(exc.code, file=sys.stderr)
    finally:
        sys.argv, cwd_before, sys.unraisablehook, registry._EXTRA[:], run = saved
        os.chdir(cwd_before)
        signals.RUN.clear()
        signals.RUN.update(run)
        signals._PENDING.clear()
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
        for key, value in saved_jax.items():
            jax.config.update(key, value)
        root.handlers[:], _ = saved_logging
        root.setLevel(saved_logging[1])
        logging._handlerList[:0] = handlers_made
        GlobalHydra.instance().hydra = composing
    proc = subprocess.CompletedProcess(sys.argv, code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"exit {code}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-3000:]}")
    return proc


def compose_train(*overrides: str):
    """configs/train.yaml composed by Hydra's compose API with these overrides (no Hydra node)."""
    from hydra import compose, initialize_config_dir

    from attnlab.config import registry

    with initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def metrics(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def events(run_dir: Path) -> EventAccumulator:
    """TensorBoard's own reader, keeping every event (size_guidance 0 = keep all)."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "histograms": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalar_curve(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in events(run_dir).Scalars(tag)]
