"""Sweep bookkeeping: job directory names, a line per finished job and a summary at the end of a multirun
that says what to run next, per-job thread limits."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from attnlab import exits

MAX_NAME = 120  # characters of swept values in a job directory name; longer ones end in a hash
TENSORBOARD_URL = "http://127.0.0.1:6006/"  # TensorBoard's default port; it prints the one it took
# One colour per normalizer (job names hold it); URL-encoded, since a bare "+" in a query reads as a space.
COLOR_BY_NORMALIZER = "?runColorGroup=regex:normalizer%3D(%5Cw%2B)"


def multirun_config(sweep_dir: Path | str) -> Any:
    """The sweep's multirun.yaml (Hydra's sweeper writes it before any job), None if it cannot be read: the one
    place that reads it (swept keys, the resume command, the HParams domains, the report's expected jobs)."""
    try:
        return OmegaConf.load(Path(sweep_dir) / "multirun.yaml")
    except (OSError, ValueError):
        return None


def sweep_overrides(saved) -> list:
    """The parsed overrides of a multirun.yaml as BasicSweeper expands them: the sweeper's params, then the
    command line's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    h = saved.hydra
    args = [f"{k}={v}" for k, v in (h.sweeper.get("params") or {}).items()] + list(h.overrides.task)
    return OverridesParser.create().parse_overrides(args)


def swept_keys(sweep_dir: Path | None, saved: Any = None) -> set[str] | None:
    """Keys this multirun sweeps (several values), from its multirun.yaml (`saved`: that file already read)."""
    saved = multirun_config(sweep_dir) if saved is None else saved
    return None if saved is None else {o.key_or_group for o in sweep_overrides(saved) if o.is_sweep_override()}


def _prog(argv0: str) -> list[str]:
    """How this process was started: `python -m attnlab` or the console script."""
    return [sys.executable, "-m", "attnlab"] if argv0.endswith("__main__.py") else ["attnlab-train"]


def resume_command(sweep_dir: Path | str, argv0: str = "") -> str:
    """The command that resumes a sweep: its own overrides (multirun.yaml) with hydra.sweep.dir pinned.

    The same command alone would start a new timestamped sweep. In the pinned directory completed jobs
    are skipped, interrupted ones resume from their checkpoint, the rest run (cli.run).
    """
    sweep_dir = Path(sweep_dir).absolute()
    saved = multirun_config(sweep_dir)
    if saved is None:
        raise FileNotFoundError(f"no readable multirun.yaml in {sweep_dir}")
    hydra_cfg = saved.hydra
    hydra_args = [o for o in hydra_cfg.overrides.hydra if not o.startswith(("hydra.mode=", "hydra.sweep.dir="))]
    return shlex.join([*_prog(argv0), "-m", *hydra_cfg.overrides.task, *hydra_args, f"hydra.sweep.dir={sweep_dir}"])


def interrupted(run_dir: Path, sweep_dir: str) -> NoReturn:
    """End a sweep stopped by a signal with the command that resumes it."""
    try:
        command = resume_command(sweep_dir, sys.argv[0])
    except (OSError, ValueError, AttributeError):  # no multirun.yaml yet: this command with the dir pinned
        args = [a for a in sys.argv[1:] if not a.startswith("hydra.sweep.dir=")]
        command = shlex.join([*_prog(sys.argv[0]), *args, f"hydra.sweep.dir={Path(sweep_dir).absolute()}"])
    print(f"attnlab: sweep interrupted at {run_dir}; resume it with:\n  {command}", file=sys.stderr, flush=True)
    sys.exit(exits.INTERRUPTED)


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


def check_pending() -> None:
    """Stop the sweep now if a signal arrived whose KeyboardInterrupt was swallowed."""
    if _PENDING:
        raise KeyboardInterrupt


def multirun_argv(args: list[str]) -> bool:
    """Whether the command line asks for a sweep; SIGTERM is an interrupt from here on (Hydra's set-up), for a
    single run as for a sweep."""
    catch_signals()
    return any(a in ("-m", "--multirun") for a in args)


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
        command = shlex.join([*_prog(argv[0]), *keep, "trainer.resume=true", f"hydra.run.dir={run_dir.absolute()}"])
    else:  # nothing was saved: the same command is the one that continues it
        what = "sweep interrupted before it started" if multirun else "run interrupted before its first checkpoint"
        command = shlex.join([*_prog(argv[0]), *argv[1:]])
    print(f"attnlab: {what}; resume it with:\n  {command}", file=sys.stderr, flush=True)
    sys.exit(exits.INTERRUPTED)


def job_name(num: int, sweep_dir: str, overrides: list[str]) -> str:
    """The `attnlab_job` resolver of hydra.sweep.subdir: named_job with the sweep's swept keys."""
    return named_job(num, overrides, swept_keys(Path(sweep_dir)))


def named_job(num: int, overrides: list[str], swept: set[str] | None) -> str:
    """`<num>_<key=value,...>` of the swept keys (every override when None), e.g. `3_normalizer=kl,seed=1`."""
    parts = [o for o in overrides if swept is None or o.split("=", 1)[0].lstrip("+~") in swept]
    name = ",".join(parts).replace("/", "-")
    if len(name) > MAX_NAME:
        name = name[:MAX_NAME] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{num}_{name}" if name else str(num)


def job_runs(job: Path) -> list[Path]:
    """The run directories of one job: the job itself, or its seed*/ runs under trainer.vmap_seeds."""
    return sorted(job.glob("seed*/")) if (job / "seeds.json").exists() else [job]


# What Hydra writes into a job's directory before the job runs (.hydra/), and what a run writes: a directory
# holding none of them is no job (report/, logs, .submitit/ ...), whatever attnlab or a launcher put it there for.
JOB_MARKERS = (".hydra", "run.json", "metrics.json", "seeds.json")


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The job directories of a sweep."""
    return sorted(p for p in Path(sweep_dir).iterdir()
                  if p.is_dir() and any((p / marker).exists() for marker in JOB_MARKERS))


def statuses(sweep_dir: Path) -> list[tuple[str, Path]]:
    """(status, run dir) of every run of a sweep's jobs: its record's status, `refused` for a job whose
    configuration was refused, `unfinished` when it left no record."""
    return [(_status(_record(run)), run) for job in job_dirs(sweep_dir) for run in job_runs(job)]


def _status(record: dict) -> str:
    if record.get("status") == "failed" and str(record.get("error", "")).startswith("configuration:"):
        return "refused"  # run_files.record_refused
    return record.get("status", "unfinished")


def finished_runs(sweep_dir: Path) -> dict[Path, int]:
    """Run directory -> its metrics.json's mtime (ns), for the runs of a sweep whose outcome is final."""
    from attnlab.run_files import FINISHED

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
    return "  ".join(part for part in (f"job {job.name}: {status}", result, f"{wall_s:.1f}s") if part)


def next_steps(sweep_dir: str, color_by_normalizer: bool) -> list[str]:
    """The commands that read a sweep: the report and TensorBoard, with the URL that colours by normalizer."""
    d = shlex.quote(str(sweep_dir))
    url = TENSORBOARD_URL + (COLOR_BY_NORMALIZER if color_by_normalizer else "")
    return ["next:", f"  attnlab-report {d}", f"  tensorboard --logdir {d} --host 127.0.0.1", f"  then open {url}"]


class SweepSummary(Callback):
    """A line per finished job; at the end, the counts (or that nothing was left to do), the runs that did not
    complete and the commands to run next; the exit code of the sweep's outcome (attnlab.exits)."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        _CURRENT["sweep_dir"] = str(config.hydra.sweep.dir)  # where an interrupt before any job resumes
        self._finished_before = finished_runs(Path(str(config.hydra.sweep.dir)))  # a re-run skips these

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        self._start = time.perf_counter()

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        from hydra.types import RunMode

        if config.hydra.mode == RunMode.MULTIRUN:  # a single run prints its own summary (run_files.print_summary)
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
        print("\n".join(next_steps(sweep_dir, "normalizer" in swept)), file=sys.stderr, flush=True)
        if threading.current_thread() is threading.main_thread():  # nothing left to stop: a late signal
            for sig in (signal.SIGINT, signal.SIGTERM):  # raised in JAX's atexit clean-up (the soak found it)
                signal.signal(sig, signal.SIG_IGN)
        code = exits.of_sweep(s for s, _ in runs)
        if code != exits.COMPLETED:
            sys.exit(code)


def limit_threads(launcher_target: str, n_jobs: int | None) -> None:
    """With joblib, give each of the n_jobs parallel jobs its share of the cores (set before JAX starts)."""
    if "joblib" not in launcher_target:
        return
    cores = os.cpu_count() or 1
    n = cores if not n_jobs or n_jobs < 0 else n_jobs
    threads = max(1, cores // n)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'}"
                               f" intra_op_parallelism_threads={threads}").strip()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
