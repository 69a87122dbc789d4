"""The loop's settings: the `trainer` config group as LoopConfig (its YAMLs' `_target_`)."""

from __future__ import annotations

import dataclasses
import warnings

from attnlab.options import trainer as trainer_options


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
    # the test split's and test lengths' final metrics carry the attention statistics (None: the task's)
    final_stats: bool | None = False

    def __post_init__(self):
        """Refuse a bad `trainer` value in one line naming it (the CLI builds the loop before the model)."""
        trainer_options.loop(
            steps=self.steps,
            batch_size=self.batch_size,
            eval_every=self.eval_every,
            log_every=self.log_every,
            eval_batch_size=self.eval_batch_size,
            nonfinite=self.nonfinite,
            progress=self.progress,
            checkpoint_every=self.checkpoint_every,
            resume=self.resume,
            attn_map_scale=self.attn_map_scale,
            max_skipped=self.max_skipped,
            final_stats=self.final_stats,
        )
        if self.eval_every in (None, "auto"):  # a val curve of about four points on short runs, one per 200 on long
            object.__setattr__(self, "eval_every", auto_eval_every(self.steps))
        elif self.eval_every > self.steps:
            warnings.warn(
                f"trainer.eval_every={self.eval_every} > trainer.steps={self.steps}: validation runs only "
                f"at the end (one point per val curve); trainer.eval_every=auto evaluates every "
                f"{auto_eval_every(self.steps)}",
                stacklevel=2,
            )


def auto_eval_every(steps: int) -> int:
    """trainer.eval_every=auto: min(200, steps // 4), at least 1."""
    return max(1, min(200, steps // 4))
