"""How a sweep or run stops on SIGINT/SIGTERM outside the step loop: the sweep and job running now, signals whose
KeyboardInterrupt Python swallowed, and the command that continues what was interrupted."""

from __future__ import annotations

import functools
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from attnlab import exits
from attnlab.sweep.definition import program, resume_command

SWEEP_FLAGS = ("-m", "--multirun")  # Hydra's flags that make a command a sweep

# The sweep and job running now: an interrupt between jobs (in Hydra's own code) still names them.
_CURRENT: dict[str, str] = {}
RUN: dict[str, str] = {}  # a single run's directory, once Hydra made it: an interrupt outside its steps names it
_PENDING: list[int] = []  # signals whose KeyboardInterrupt may have been swallowed (_interrupt)


def _interrupt(signum: int, frame: Any) -> None:
    """A sweep's SIGINT/SIGTERM outside the step loop: KeyboardInterrupt, remembered in _PENDING in case it is
    swallowed (Python ignores exceptions from gc and weakref callbacks and __del__; raised in JAX's gc callback,
    a Ctrl-C was lost and the sweep ran on), so the job's end stops the sweep (check_pending)."""
    _PENDING.append(signum)
    raise KeyboardInterrupt


def signals_held(method):
    """Run `method` with SIGINT/SIGTERM held, then re-send the first one that came.

    For work a KeyboardInterrupt must not break into: orbax's asyncio machinery left its threads printing
    "Event loop is closed" tracebacks at exit (found by tests/sweep/test_signals.py), and jaxlib's start-up runs
    Python called from C++ (its MLIR initialisation), where the exception aborted the process (found by
    tests/train/test_reliability.py's soak). The work is short, so the signal waits for it and then reaches whatever
    handler was installed (train.StopRequest, the sweep's).
    """

    @functools.wraps(method)
    def held(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return method(*args, **kwargs)
        came: list[int] = []
        old = {
            sig: signal.signal(sig, lambda signum, frame: came.append(signum))
            for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            return method(*args, **kwargs)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)
            if came:
                signal.raise_signal(came[0])

    return held


def _unraisable(info: Any) -> None:
    """Python's "Exception ignored in ..." report, except for a KeyboardInterrupt that _PENDING keeps."""
    if not (isinstance(info.exc_value, KeyboardInterrupt) and _PENDING):
        sys.__unraisablehook__(info)


def catch_signals() -> None:
    """SIGTERM (SLURM's preemption, `kill`) stops a sweep as Ctrl-C does: KeyboardInterrupt outside the step
    loop, a checkpoint then a stop inside it (train.StopRequest), and the resume command either way."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _interrupt)
        sys.unraisablehook = _unraisable


def pending() -> bool:
    """Whether a SIGINT/SIGTERM has arrived outside the step loop."""
    return bool(_PENDING)


def check_pending() -> None:
    """Stop the sweep now if a signal arrived whose KeyboardInterrupt was swallowed."""
    if _PENDING:
        raise KeyboardInterrupt


def multirun_argv(args: list[str]) -> bool:
    """Whether the command line asks for a sweep; SIGTERM is an interrupt from here on (Hydra's set-up), for a
    single run as for a sweep."""
    catch_signals()
    return any(a in SWEEP_FLAGS for a in args)


def sweep_started(sweep_dir: str) -> None:
    """Called as a multirun starts: an interrupt before its first job resumes this sweep directory."""
    _CURRENT["sweep_dir"] = sweep_dir


def job_started(run_dir: str, sweep_dir: str) -> None:
    """Called as each sweep job starts (also for hydra.mode=MULTIRUN without -m)."""
    catch_signals()
    _CURRENT.update(run_dir=run_dir, sweep_dir=sweep_dir)
    check_pending()


def interrupted_outside_a_job(multirun: bool, argv: list[str]) -> NoReturn:
    """End a run or sweep interrupted outside the step loop (start-up, compile, final metrics, Hydra's code
    between jobs) with the command that continues it; exit code exits.INTERRUPTED."""
    if _CURRENT:  # a job of this process ran, or the sweep started (launchers running jobs elsewhere)
        interrupted(Path(_CURRENT.get("run_dir", _CURRENT["sweep_dir"])), _CURRENT["sweep_dir"])
    run_dir = Path(RUN["run_dir"]) if RUN.get("run_dir") and not multirun else None
    if run_dir is not None and (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir()):
        keep = [a for a in argv[1:] if not a.startswith(("hydra.run.dir=", "trainer.resume="))]
        what = "run interrupted outside its steps"
        command = shlex.join([*program(argv[0]), *keep, "trainer.resume=true", f"hydra.run.dir={run_dir.absolute()}"])
    else:  # nothing was saved: the same command is the one that continues it
        what = "sweep interrupted before it started" if multirun else "run interrupted before its first checkpoint"
        command = shlex.join([*program(argv[0]), *argv[1:]])
    print(f"attnlab: {what}; resume it with:\n  {command}", file=sys.stderr, flush=True)
    sys.exit(exits.INTERRUPTED)


def interrupted(run_dir: Path, sweep_dir: str) -> NoReturn:
    """End a sweep stopped by a signal with the command that resumes it."""
    try:
        command = resume_command(sweep_dir, sys.argv[0])
    except (OSError, ValueError, AttributeError):  # no multirun.yaml yet: this command with the dir pinned
        args = [a for a in sys.argv[1:] if not a.startswith("hydra.sweep.dir=")]
        command = shlex.join([*program(sys.argv[0]), *args, f"hydra.sweep.dir={Path(sweep_dir).absolute()}"])
    print(f"attnlab: sweep interrupted at {run_dir}; resume it with:\n  {command}", file=sys.stderr, flush=True)
    sys.exit(exits.INTERRUPTED)
