"""Orbax checkpoints of the whole training state, with fallback past a partial or corrupt latest one.

No signal handling here: the training loop holds SIGINT/SIGTERM around these calls (train.stopping.HeldCheckpoints).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as pp

logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every save at INFO


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was required."""


class Checkpoints:
    """state (a pytree of arrays: params, optimizer, RNG key data, step, best params) + meta (JSON:
    best-val metrics) under <run_dir>/checkpoints/<step>/, the last `keep` kept."""

    def __init__(self, run_dir: Path, keep: int = 2):
        self.directory = Path(run_dir).resolve() / "checkpoints"
        options = ocp.CheckpointManagerOptions(
            preservation_policy=pp.LatestN(keep), enable_async_checkpointing=False, create=True
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        if step in self.manager.all_steps():
            return
        self.manager.save(
            step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True
        )
        self.manager.wait_until_finished()

    def steps(self) -> list[int]:
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def restore_latest(self, template: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, meta) of the newest readable checkpoint; None if there is none at all."""
        steps = self.steps()
        for step in reversed(steps):
            try:
                out = self.manager.restore(
                    step, args=ocp.args.Composite(state=ocp.args.StandardRestore(template), meta=ocp.args.JsonRestore())
                )
                return step, out["state"], out["meta"]
            except Exception as exc:  # a partial or corrupt checkpoint: try the one before
                warnings.warn(
                    f"checkpoint {self.directory / str(step)} is unreadable ({type(exc).__name__}: "
                    f"{str(exc)[:200]}); falling back to an earlier one",
                    stacklevel=2,
                )
        if steps:
            raise CheckpointError(f"no usable checkpoint in {self.directory} (tried steps {steps})")
        return None

    def close(self) -> None:
        self.manager.close()
