"""The loop's settings, its stop conditions (non-finite policy, signals) and small helpers shared by its phases."""

from __future__ import annotations

import dataclasses
import signal
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from attnlab import checks
from attnlab.progress import MODES


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Run-level settings of the loop: the `trainer` config group (its YAMLs' `_target_`) and the seed."""

    steps: int
    batch_size: int
    eval_every: int | str | None  # null or auto: auto_eval_every(steps)
    log_every: int
    eval_batch_size: int
    nonfinite: str  # skip | stop
    seed: int
    progress: str = "auto"
    checkpoint_every: int = 0  # 0: only on a signal and at the end
    resume: bool = False
    attn_map_scale: str = "row"  # row | log | max (attnlab.tb_images.scaled)
    max_skipped: float = 0.1  # share of `steps` that may be skipped as non-finite before the run is diverged

    def __post_init__(self):
        """Refuse a bad `trainer` value in one line naming it (the CLI builds the loop before the model)."""
        checks.integer("trainer.steps", self.steps, 1, 2**31 - 1)
        if self.eval_every in (None, "auto"):  # a val curve of about four points on short runs, one per 200 on long
            object.__setattr__(self, "eval_every", auto_eval_every(self.steps))
        elif checks.is_int(self.eval_every) and self.eval_every > self.steps:
            warnings.warn(f"trainer.eval_every={self.eval_every} > trainer.steps={self.steps}: validation runs only "
                          f"at the end (one point per val curve); trainer.eval_every=auto evaluates every "
                          f"{auto_eval_every(self.steps)}")
        for key in ("batch_size", "eval_every", "log_every", "eval_batch_size"):
            checks.integer(f"trainer.{key}", getattr(self, key), 1, 2**31 - 1)
        checks.integer("trainer.checkpoint_every", self.checkpoint_every, 0, 2**31 - 1)  # 0: signals and the end
        checks.boolean("trainer.resume", self.resume)
        checks.real("trainer.max_skipped", self.max_skipped, 0.0, 1.0)
        for key, allowed in (("nonfinite", ("skip", "stop")), ("attn_map_scale", ("row", "log", "max")),
                             ("progress", MODES)):
            checks.choice(f"trainer.{key}", getattr(self, key), allowed)


def auto_eval_every(steps: int) -> int:
    """trainer.eval_every=auto: min(200, steps // 4), at least 1."""
    return max(1, min(200, steps // 4))


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
        return (f"{nonfinite} non-finite steps skipped, more than trainer.max_skipped={cfg.max_skipped:g} "
                f"of trainer.steps={cfg.steps}")
    return None


def pad_split(split, multiple: int) -> dict[str, np.ndarray]:
    """A split as arrays padded to a multiple of the eval batch, padding rows weighted 0."""
    arrays = {f.name: np.asarray(getattr(split, f.name)) for f in dataclasses.fields(split)}
    pad = -arrays["targets"].shape[0] % multiple
    return {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in arrays.items()}


def prefixed(prefix: str, metrics: dict) -> dict[str, float]:
    return {f"{prefix}/{k}": float(v) for k, v in metrics.items()}


def stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def seed_slice(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


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

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
