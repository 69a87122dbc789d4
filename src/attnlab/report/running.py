"""Runs of a sweep without an outcome yet: how far each has got (its TensorBoard events) and when it last wrote."""

from __future__ import annotations

import math
import time
from pathlib import Path

from attnlab.report.load import Run, has_scalars, scalars

# A run that has written nothing for this long is reported as stopped without a record, not as running.
STALE_S = 30 * 60


def last_write(path: Path) -> float:
    """The newest modification time (s since the epoch) among a run directory's files and its checkpoints."""
    files = [p for p in path.iterdir() if p.is_file()] + list((path / "checkpoints").glob("*"))
    return max((p.stat().st_mtime for p in files), default=path.stat().st_mtime)


def state(run: Run, now: float | None = None) -> str:
    """`running: step 150/400, train loss 1.23 (last written 12 s ago)`, or `stopped? ...` when stale."""
    age = (time.time() if now is None else now) - last_write(run.path)
    total = run.config.get("trainer.steps")
    losses = scalars(run.path).get("train/loss", {}) if has_scalars(run.path) else {}
    if losses:
        step = max(losses)
        where = f"step {step}/{total}" + (f", train loss {losses[step]:.4g}" if math.isfinite(losses[step]) else "")
    else:
        where = "no step logged yet (building or compiling)"
    when = f"last written {_ago(age)} ago"
    return f"stopped? nothing written for {_ago(age)}; {where}" if age > STALE_S else f"running: {where} ({when})"


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def section(runs: list[Run], root: Path, now: float | None = None) -> list[str]:
    """The report's Running section: one line per run without an outcome (status incomplete); none when all have
    one."""
    live = [r for r in runs if r.status == "incomplete"]
    if not live:
        return []
    lines = ["## Still running", "", f"{len(live)} run(s) without an outcome yet; the tables hold the finished ones:"]
    lines += [f"- {_rel(r.path, root)}: {state(r, now)}" for r in live]
    return lines


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root)) or path.name
    except ValueError:
        return str(path)
