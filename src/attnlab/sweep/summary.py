"""A sweep's jobs and their outcomes: a line per finished job, and at the end of a multirun a summary that says
what to run next and the sweep's exit code."""

from __future__ import annotations

import json
import math
import shlex
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode

from attnlab import exits
from attnlab.run.convergence import describe
from attnlab.run.record import FINISHED
from attnlab.run.summary import tensorboard_lines
from attnlab.sweep.definition import swept_keys
from attnlab.sweep.signals import sweep_started


def job_runs(job: Path) -> list[Path]:
    """The run directories of one job: the job itself, or its seed*/ runs under trainer.vmap_seeds."""
    return sorted(job.glob("seed*/")) if (job / "seeds.json").exists() else [job]


# What Hydra writes into a job's directory before the job runs (.hydra/), and what a run writes: a directory
# holding none of them is no job (report/, logs, .submitit/ ...), whatever attnlab or a launcher put it there for.
JOB_MARKERS = (".hydra", "run.json", "metrics.json", "seeds.json")


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The job directories of a sweep."""
    return sorted(
        p for p in Path(sweep_dir).iterdir() if p.is_dir() and any((p / marker).exists() for marker in JOB_MARKERS)
    )


def statuses(sweep_dir: Path) -> list[tuple[str, Path]]:
    """(status, run dir) of every run of a sweep's jobs: its record's status, `refused` for a job whose
    configuration was refused, `unfinished` when it left no record."""
    return [(_status(_record(run)), run) for job in job_dirs(sweep_dir) for run in job_runs(job)]


def _status(record: dict) -> str:
    if record.get("status") == "failed" and str(record.get("error", "")).startswith("configuration:"):
        return "refused"  # run.files.record_refused
    return record.get("status", "unfinished")


def finished_runs(sweep_dir: Path) -> dict[Path, int]:
    """Run directory -> its metrics.json's mtime (ns), for the runs of a sweep whose outcome is final."""
    if not Path(sweep_dir).is_dir():
        return {}
    return {run: (run / "metrics.json").stat().st_mtime_ns for status, run in statuses(sweep_dir) if status in FINISHED}


def _record(run: Path) -> dict:
    try:
        record = json.loads((run / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def job_line(job: Path, wall_s: float) -> str:
    """One line for a finished job: name, status, headline test metric (metrics.json's `headline`; mean over its
    seeds), wall time."""
    records = [_record(run) for run in job_runs(job)]
    counts = Counter(r.get("status", "unfinished") for r in records)
    status = ", ".join(f"{n} {s}" if len(records) > 1 else s for s, n in sorted(counts.items()))
    done = [r for r in records if r.get("status") == "completed" and isinstance(r.get("final"), dict)]
    key = next((r["headline"] for r in done if r.get("headline")), None)
    values = [v for v in (r["final"].get(key) for r in done) if isinstance(v, (int, float)) and math.isfinite(v)]
    result = ""
    if values:
        mean = sum(values) / len(values)
        result = f"{key} {mean:.4f}" + (f" (mean of {len(values)} seeds)" if len(values) > 1 else "")
    errors = [str(r["error"]) for r in records if r.get("error")]
    if not result and errors:
        result = errors[0] if len(errors[0]) <= 100 else errors[0][:97] + "..."
    flags = _flags(done)
    return "  ".join(part for part in (f"job {job.name}: {status}", result, f"{wall_s:.1f}s", flags) if part)


def _flags(done: list[dict]) -> str:
    """`warning: at plateau: test/accuracy ≈ 1/pairs 0.25 (2 of 3 seeds)`: what attnlab.run.convergence flagged,
    counted over a job's seeds."""
    counts: dict[str, int] = {}
    for r in done:
        for part in filter(None, describe(r).split("; ")):
            key = part.split(" (")[0]  # the same flag, whatever each seed's own numbers
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        return ""
    of = f" of {len(done)} seeds" if len(done) > 1 else ""
    return "warning: " + "; ".join(f"{k}" + (f" ({n}{of})" if of else "") for k, n in counts.items())


def color_keys(swept) -> list[str]:
    """The swept keys that colour a sweep's runs in TensorBoard: all but the seed (a seed's runs share a colour)."""
    return sorted(k for k in swept if k != "seed")


def next_steps(sweep_dir: str, color_by: list[str]) -> list[str]:
    """The commands that read a sweep: the report and TensorBoard, with the URL that colours runs by `color_by`."""
    d = shlex.quote(str(sweep_dir))
    return ["next:", f"  attnlab-report {d}", *tensorboard_lines(str(sweep_dir), color_by, prefix="  ")]


class SweepSummary(Callback):
    """A line per finished job; at the end, the counts (or that nothing was left to do), the runs that did not
    complete and the commands to run next; the exit code of the sweep's outcome (attnlab.exits)."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        sweep_started(str(config.hydra.sweep.dir))
        self._finished_before = finished_runs(Path(str(config.hydra.sweep.dir)))  # a re-run skips these

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        self._start = time.perf_counter()

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:

        if config.hydra.mode == RunMode.MULTIRUN:  # a single run prints its own summary (run.summary.print_summary)
            wall_s = time.perf_counter() - getattr(self, "_start", time.perf_counter())
            print(job_line(Path(config.hydra.runtime.output_dir), wall_s), file=sys.stderr, flush=True)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = config.hydra.sweep.dir
        runs = statuses(Path(sweep_dir))
        counts = ", ".join(f"{n} {s}" for s, n in sorted(Counter(s for s, _ in runs).items())) or "no job ran"
        finished = finished_runs(Path(sweep_dir))
        if runs and len(finished) == len(runs) and finished == getattr(self, "_finished_before", None):
            counts = f"nothing left to do, every job had already finished with this config ({counts})"
        print(f"sweep {sweep_dir}: {counts}", file=sys.stderr)
        for status, run in runs:
            if status != "completed":
                print(f"  {status:10s} {run}", file=sys.stderr)
        swept = swept_keys(Path(sweep_dir)) or set()
        print("\n".join(next_steps(sweep_dir, color_keys(swept))), file=sys.stderr, flush=True)
        if threading.current_thread() is threading.main_thread():  # nothing left to stop: a late signal
            for sig in (signal.SIGINT, signal.SIGTERM):  # raised in JAX's atexit clean-up (the soak found it)
                signal.signal(sig, signal.SIG_IGN)
        code = exits.of_sweep(s for s, _ in runs)
        if code != exits.COMPLETED:
            sys.exit(code)
