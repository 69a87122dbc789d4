"""What a sweep was asked to run (its multirun.yaml) against what its directory holds: the report's first lines."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from attnlab.report.load import Run
from attnlab.run.record import STATUSES  # the outcomes; anything else has no result yet
from attnlab.sweep import definition
from attnlab.sweep.naming import named_job


def expected_jobs(sweep_dir: Path) -> list[tuple[str, int]] | None:
    """(job directory name, runs it holds) for every job the sweep defines, in launch order; None when the
    sweep's definition cannot be read (no multirun.yaml, or a sweep the basic sweeper does not expand)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.errors import HydraException

    saved = definition.multirun_config(sweep_dir)  # read and parsed once for every job's name (not per job)
    try:
        [jobs] = BasicSweeper.split_arguments(definition.sweep_overrides(saved), None)
    except (ValueError, HydraException, AttributeError):  # None (unreadable), or a sweep BasicSweeper cannot expand
        return None
    base_seeds, swept = saved.get("trainer", {}).get("vmap_seeds", 1), definition.swept_keys(sweep_dir, saved)
    out = []
    for num, overrides in enumerate(jobs):
        seeds = [o.split("=", 1)[1] for o in overrides if o.startswith("trainer.vmap_seeds=")]
        out.append((named_job(num, overrides, swept), int(seeds[0]) if seeds else int(base_seeds)))
    return out


def sweep_dirs(root: Path) -> list[Path]:
    """The sweeps under `root` (itself one, or a folder of them): directories holding a multirun.yaml."""
    return sorted(Path(d) for d, _, files in os.walk(root) if "multirun.yaml" in files)


def progress(root: Path, runs: list[Run]) -> tuple[str, list[str]]:
    """("N of M runs completed (…); missing: …", the missing names): M counts every run each sweep under `root`
    defines (plus runs outside any sweep); missing lists the jobs not started and the runs without an outcome."""
    root = Path(root)
    counts = Counter(r.status for r in runs)
    paths = [r.path.resolve() for r in runs]
    by_path = dict(zip(paths, runs))
    in_job: dict[Path, list[tuple[Path, Run]]] = {}  # a job directory -> its runs: itself, or its seed*/ runs
    for p, r in by_path.items():
        for job in {p, p.parent}:
            in_job.setdefault(job, []).append((p, r))
    expected, missing, seen = 0, [], set()
    for sweep in sweep_dirs(root):
        jobs = expected_jobs(sweep)
        if jobs is None:
            continue
        for name, n_runs in jobs:
            job = sweep / name
            expected += n_runs
            rel = _rel(job, root)
            found = in_job.get(job.resolve(), [])
            seen.update(p for p, _ in found)
            held = [r for _, r in found]
            if not held:  # Hydra writes .hydra/ as a job starts; run.json follows once the run is built
                missing.append(f"{rel} (started, building)" if (job / ".hydra").is_dir() else f"{rel} (not started)")
                continue
            missing += [f"{_rel(r.path, root)} ({r.status})" for r in held if r.status not in STATUSES]
            missing += [f"{rel} ({n_runs - len(held)} seed run(s) not written)"] if len(held) < n_runs else []
    for p, r in zip(paths, runs):  # runs outside any readable sweep definition count as they are
        if p not in seen:
            expected += 1
            if r.status not in STATUSES:
                missing.append(f"{_rel(r.path, root)} ({r.status})")
    others = ", ".join(f"{counts[s]} {s}" for s in ("diverged", "failed") if counts[s])
    head = f"{counts['completed']} of {expected} runs completed" + (f" ({others})" if others else "")
    return head + (f"; missing: {', '.join(missing)}" if missing else "; none missing") + ".", missing


def _rel(path: Path, root: Path) -> str:
    try:
        rel = path.relative_to(root)
    except ValueError:
        return str(path)
    return path.name if rel == Path(".") else str(rel)
