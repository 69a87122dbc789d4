"""The loop's settings: the `trainer` config group as LoopConfig (its YAMLs' `_target_`)."""

from __future__ import annotations

import dataclasses
import warnings

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
    attn_map_scale: str = "row"  # row | log | max (attnlab.board.images.scaled)
    max_skipped: float = 0.1  # share of `steps` that may be skipped as non-finite before the run is diverged
    final_stats: bool = False  # the test split's and test lengths' final metrics carry the attention statistics

    def __post_init__(self):
        """Refuse a bad `trainer` value in one line naming it (the CLI builds the loop before the model)."""
        checks.integer("trainer.steps", self.steps, 1, 2**31 - 1)
        if self.eval_every in (None, "auto"):  # a val curve of about four points on short runs, one per 200 on long
            object.__setattr__(self, "eval_every", auto_eval_every(self.steps))
        elif checks.is_int(self.eval_every) and self.eval_every > self.steps:
            warnings.warn(
                f"trainer.eval_every={self.eval_every} > trainer.steps={self.steps}: validation runs only "
                f"at the end (one point per val curve); trainer.eval_every=auto evaluates every "
                f"{auto_eval_every(self.steps)}",
                stacklevel=2,
            )
        for key in ("batch_size", "eval_every", "log_every", "eval_batch_size"):
            checks.integer(f"trainer.{key}", getattr(self, key), 1, 2**31 - 1)
        checks.integer("trainer.checkpoint_every", self.checkpoint_every, 0, 2**31 - 1)  # 0: signals and the end
        checks.boolean("trainer.resume", self.resume)
        checks.boolean("trainer.final_stats", self.final_stats)
        checks.real("trainer.max_skipped", self.max_skipped, 0.0, 1.0)
        for key, allowed in (
            ("nonfinite", ("skip", "stop")),
            ("attn_map_scale", ("row", "log", "max")),
            ("progress", MODES),
        ):
            checks.choice(f"trainer.{key}", getattr(self, key), allowed)


def auto_eval_every(steps: int) -> int:
    """trainer.eval_every=auto: min(200, steps // 4), at least 1."""
    return max(1, min(200, steps // 4))
