"""The trainer group's options (attnlab.train.LoopConfig) and the run's seeds, checked without jax."""

from __future__ import annotations

from attnlab import checks
from attnlab.progress import MODES


def loop(
    *,
    steps,
    batch_size,
    eval_every,
    log_every,
    eval_batch_size,
    nonfinite,
    progress,
    checkpoint_every,
    resume,
    attn_map_scale,
    max_skipped,
    final_stats,
) -> None:
    """trainer=default: attnlab.train.LoopConfig (eval_every null or auto: set from steps when built)."""
    checks.integer("trainer.steps", steps, 1, 2**31 - 1)
    for key, value in (
        ("batch_size", batch_size),
        ("eval_every", eval_every),
        ("log_every", log_every),
        ("eval_batch_size", eval_batch_size),
    ):
        if not (key == "eval_every" and value in (None, "auto")):
            checks.integer(f"trainer.{key}", value, 1, 2**31 - 1)
    checks.integer("trainer.checkpoint_every", checkpoint_every, 0, 2**31 - 1)  # 0: signals and the end
    checks.boolean("trainer.resume", resume)
    if final_stats is not None:  # null: the task's (Task.measures_sinks)
        checks.boolean("trainer.final_stats", final_stats)
    checks.real("trainer.max_skipped", max_skipped, 0.0, 1.0)
    checks.choice("trainer.nonfinite", nonfinite, ("skip", "stop"))
    checks.choice("trainer.attn_map_scale", attn_map_scale, ("row", "log", "max"))
    checks.choice("trainer.progress", progress, MODES)


def seeds(*, seed, vmap_seeds) -> None:
    """trainer.vmap_seeds (the nets trained as one program, read by the CLI) and the top-level seed, whose range
    leaves room for them."""
    checks.integer("trainer.vmap_seeds", vmap_seeds, 1, 4096)
    checks.require(
        checks.is_int(seed) and 0 <= seed < 2**31 - vmap_seeds,
        f"seed={seed!r} is invalid; allowed: an integer in [0, 2^31 - trainer.vmap_seeds)",
    )


DECLARED = {"attnlab.train.LoopConfig": (loop,)}
