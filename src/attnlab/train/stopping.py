"""When the loop stops before its last step: the non-finite policy (Diverged) and signals (StopRequest, and the
checkpoint calls a signal must wait for: HeldCheckpoints)."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING

import jax
import numpy as np
from jax.experimental import multihost_utils

from attnlab.checkpoint import Checkpoints
from attnlab.sweep.signals import signals_held

if TYPE_CHECKING:
    from attnlab.train.config import LoopConfig


class Diverged(Exception):
    """Every seed diverged: the `stop` policy met a non-finite step, or more than max_skipped were skipped."""


def skip_limit(cfg: LoopConfig) -> float:
    """Skipped (non-finite) steps beyond this many make a run diverged: a share of the planned steps, so the
    verdict can be reached as soon as the count passes it."""
    return cfg.max_skipped * cfg.steps


def divergence(cfg: LoopConfig, nonfinite: int) -> str | None:
    """Why a seed with `nonfinite` skipped steps is diverged; None if it is not."""
    if cfg.nonfinite == "stop" and nonfinite > 0:
        return "non-finite loss, gradient or parameters (trainer.nonfinite=stop)"
    if nonfinite > skip_limit(cfg):
        return (
            f"{nonfinite} non-finite steps skipped, more than trainer.max_skipped={cfg.max_skipped:g} "
            f"of trainer.steps={cfg.steps}"
        )
    return None


class StopRequest:
    """SIGTERM/SIGINT set a flag that the loop reads between steps (graceful: checkpoint, then stop)."""

    def __init__(self):
        self.signal: int | None = None
        self._old = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signal = signum

    def agreed(self) -> int | None:
        """The signal every process of the run stops for, at the same step: in a run that spans processes
        (accelerator.distributed) a signal may reach one process only, or each at another step (SLURM signals
        every task), and a process that stopped alone would leave the others waiting in the next step's
        all-reduce. So each step the processes exchange their flags; one process alone reads its own."""
        if jax.process_count() == 1:
            return self.signal
        flags = multihost_utils.process_allgather(np.int32(self.signal or 0))
        return int(np.max(flags)) or None

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


class HeldCheckpoints(Checkpoints):
    """Checkpoints whose orbax calls run with SIGINT/SIGTERM held (sweep.signals.signals_held): a signal waits for
    the call, then reaches the handler installed (StopRequest in the step loop, the sweep's outside it)."""

    __init__ = signals_held(Checkpoints.__init__)
    save = signals_held(Checkpoints.save)
    steps = signals_held(Checkpoints.steps)
    restore_latest = signals_held(Checkpoints.restore_latest)
    close = signals_held(Checkpoints.close)
