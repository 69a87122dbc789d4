"""Sweep bookkeeping: job directory names, a summary at the end of a multirun, per-job thread limits."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

MAX_NAME = 120  # characters of swept values in a job directory name; longer ones end in a hash


def swept_keys(sweep_dir: Path) -> set[str] | None:
    """Keys this multirun sweeps (several values), from the multirun.yaml Hydra's sweeper writes first."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        hydra_cfg = OmegaConf.load(Path(sweep_dir) / "multirun.yaml").hydra
    except (OSError, ValueError):
        return None
    args = list(hydra_cfg.overrides.task) + [f"{k}={v}" for k, v in (hydra_cfg.sweeper.get("params") or {}).items()]
    return {o.key_or_group for o in OverridesParser.create().parse_overrides(args) if o.is_sweep_override()}


def job_name(num: int, sweep_dir: str, overrides: list[str]) -> str:
    """`<num>_<key=value,...>` of the keys the sweep varies, e.g. `3_normalizer=kl,seed=1` (hydra.sweep.subdir)."""
    swept = swept_keys(Path(sweep_dir))
    parts = [o for o in overrides if swept is None or o.split("=", 1)[0].lstrip("+~") in swept]
    name = ",".join(parts).replace("/", "-")
    if len(name) > MAX_NAME:
        name = name[:MAX_NAME] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{num}_{name}" if name else str(num)


def statuses(sweep_dir: Path) -> list[tuple[str, Path]]:
    """(status, run dir) of every job directory under a sweep; 'unfinished' when it left no record."""
    out = []
    jobs = sorted(p for p in Path(sweep_dir).iterdir() if p.is_dir() and not p.name.startswith("."))
    for job in jobs:
        seeds = sorted(job.glob("seed*/")) if (job / "seeds.json").exists() else [job]  # trainer.vmap_seeds
        out.extend(_status(run) for run in seeds)
    return out


def _status(run: Path) -> tuple[str, Path]:
    try:
        status = json.loads((run / "metrics.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        status = "unfinished"
    return status, run


class SweepSummary(Callback):
    """Prints completed / diverged / failed with paths; exits non-zero only if a job failed."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        runs = statuses(Path(config.hydra.sweep.dir))
        counts = Counter(s for s, _ in runs)
        print(f"sweep {config.hydra.sweep.dir}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
              file=sys.stderr)
        for status, run in runs:
            if status != "completed":
                print(f"  {status:10s} {run}", file=sys.stderr)
        if counts.get("failed") or counts.get("unfinished"):
            sys.exit(1)


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
