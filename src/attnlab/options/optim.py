"""The optim group's options (attnlab.optim), checked without jax."""

from __future__ import annotations

from attnlab import checks


def optimizer(*, lr, warmup_steps, clip_norm, final_fraction) -> None:
    """The values every optimizer shares (attnlab.optim.Optimizer)."""
    checks.real("optim.lr", lr, 0.0, 1e6, lo_open=True)
    checks.integer("optim.warmup_steps", warmup_steps, 0, 2**31 - 1)
    checks.real("optim.clip_norm", clip_norm, 0.0, lo_open=True)
    checks.real("optim.final_fraction", final_fraction, 0.0, 1.0)


def adamw(*, weight_decay, b1, b2) -> None:
    """optim=adamw, beside `optimizer`'s."""
    checks.real("optim.weight_decay", weight_decay, 0.0, 1e6)
    checks.real("optim.b1", b1, 0.0, 1.0, hi_open=True)
    checks.real("optim.b2", b2, 0.0, 1.0, hi_open=True)


def sgd(*, momentum, nesterov, weight_decay) -> None:
    """optim=sgd, beside `optimizer`'s."""
    checks.real("optim.momentum", momentum, 0.0, 1.0, hi_open=True)
    checks.boolean("optim.nesterov", nesterov)
    checks.real("optim.weight_decay", weight_decay, 0.0, 1e6)


DECLARED = {"attnlab.optim.AdamW": (optimizer, adamw), "attnlab.optim.SGD": (optimizer, sgd)}
