"""Reading a sweep: run directories → Run records (JSON; Hydra's YAML only for runs without run.json)."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from attnlab.report.records import SCALARS, decode_scalars
from attnlab.run.convergence import still_falling
from attnlab.run.events import read_scalars

log = logging.getLogger(__name__)  # unconfigured: Python's last-resort handler writes warnings to stderr
LR = "optim.lr"
SEED = "seed"
MISSING = "<missing>"
# How a run was executed, not what it computes: never a default group key even when it varies.
OPERATIONAL = frozenset(
    {
        "trainer.vmap_seeds",
        "trainer.resume",
        "trainer.progress",
        "trainer.checkpoint_every",
        "compile_cache",
        "accelerator.gpu_memory_fraction",
        "accelerator.distributed",
    }
)


@dataclass
class Run:
    """One run directory: status, flat config and its final/best metric records."""

    path: Path
    status: str  # metrics.json's (completed | diverged | failed | interrupted), or incomplete | unreadable
    config: dict[str, Any]
    final: dict[str, float] = field(default_factory=dict)
    best: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    swept: tuple[str, ...] = ()  # keys set on the command line, in order
    chance: dict[str, dict] = field(default_factory=dict)  # metric -> attnlab.run.chance flag (threshold, ...)
    baseline: dict[str, float] = field(default_factory=dict)  # the task's baselines (chance, bigram, ...)
    headline: str | None = None  # the metric the task judges a run by (metrics.json's, Task.judged_by)
    baseline_labels: dict[str, dict] = field(default_factory=dict)  # metric -> {baseline key: label}
    env: dict[str, Any] = field(default_factory=dict)  # run.json's env: git state, package versions, devices
    convergence: dict[str, Any] = field(default_factory=dict)  # attnlab.run.convergence.still_falling
    plateaus: dict[str, list] = field(default_factory=dict)  # test metric -> [{label, value, low, high, at}]
    # "attn_<name>" -> "higher" | "lower" | None (no better direction): metrics.json's, as the run's statistics
    # declared them (attnlab.statistics.directions); {} for a run recorded before it
    directions: dict[str, str | None] = field(default_factory=dict)
    train_tokens: int | None = None  # a language model's training text in tokens (run.json's corpus.train_tokens)

    @property
    def seed(self):
        return self.config.get(SEED)

    def value(self, metric: str, which: str) -> float | None:
        """A finite metric value of a completed run, else None."""
        v = (self.final if which == "final" else self.best).get(metric)
        ok = self.status == "completed" and isinstance(v, (int, float)) and math.isfinite(v)
        return float(v) if ok else None


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested config → {"group.key": scalar}; `_target_`-like keys dropped (they follow from the choice)."""
    out = {}
    for k, v in d.items():
        if str(k).startswith("_"):
            continue
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v) if isinstance(v, list) else v  # hashable
    return out


def _flat_config(config: dict, choices: dict) -> dict[str, Any]:
    flat = flatten(config)
    flat.update({g: c for g, c in choices.items() if "/" not in g and c is not None})  # not hydra/*
    if "head" not in flat and isinstance(config.get("task"), dict) and config["task"].get("default_head"):
        flat["head"] = config["task"]["default_head"]  # head=null means the task's default head
    return flat


def _override_key(o: str) -> str:
    return o.split("=", 1)[0].lstrip("+~")


def _json(path: Path):
    """A JSON file's content; None when absent, "unreadable" when it does not parse."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return "unreadable"


def _read_run(path: Path, metrics) -> Run:
    """The run in `path`, given its metrics.json as _json read it."""
    rec = _json(path / "run.json")
    for name, content, then in (
        ("metrics.json", metrics, "the run counts as unreadable"),
        ("run.json", rec, "its config is read from .hydra/ where there is one"),
    ):
        if content == "unreadable":
            log.warning("attnlab-report: warning: %s does not parse as JSON; %s", path / name, then)
    if metrics is None:
        status = "incomplete"  # running, or killed before writing its record
    elif isinstance(metrics, dict):
        status = metrics.get("status", "unknown")
    else:
        status, metrics = "unreadable", None
    metrics = metrics or {}
    config, swept, env, train_tokens = {}, (), {}, None
    if isinstance(rec, dict):
        env = rec.get("env") or {}
        train_tokens = (rec.get("corpus") or {}).get("train_tokens")
        config = _flat_config(rec.get("config", {}), rec.get("choices", {}))
        swept = tuple(_override_key(o) for o in rec.get("overrides", []))
    elif (path / ".hydra" / "config.yaml").exists():
        # Runs that failed before training have no run.json; Hydra's own record of the job (written
        # before it starts) still places them in their cell. safe_load builds plain data, never objects.

        h = path / ".hydra"
        hydra = yaml.safe_load((h / "hydra.yaml").read_text()) if (h / "hydra.yaml").exists() else {}
        runtime = (hydra or {}).get("hydra", {}).get("runtime", {})
        config = _flat_config(yaml.safe_load((h / "config.yaml").read_text()) or {}, runtime.get("choices", {}))
        if (h / "overrides.yaml").exists():
            swept = tuple(_override_key(o) for o in yaml.safe_load((h / "overrides.yaml").read_text()) or [])
    return Run(
        path=path,
        status=status,
        config=config,
        final=metrics.get("final") or {},
        best=metrics.get("best") or {},
        error=metrics.get("error"),
        swept=swept,
        chance=metrics.get("chance") or {},
        baseline=metrics.get("baseline") or {},
        headline=metrics.get("headline"),
        baseline_labels=metrics.get("baseline_labels") or {},
        env=env,
        convergence=metrics.get("convergence") or _convergence_from_events(path, status, config),
        plateaus=metrics.get("plateaus") or {},
        directions=metrics.get("directions") or {},
        train_tokens=train_tokens,
    )


def has_scalars(path: Path) -> bool:
    """Whether a run directory holds its TensorBoard scalars: event files, or a records file's SCALARS."""
    return (path / SCALARS).exists() or any(path.glob("events.out.tfevents.*"))


def scalars(path: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of a run directory: from a records file's SCALARS where unpacked, else its events."""
    if (path / SCALARS).exists():
        return decode_scalars(json.loads((path / SCALARS).read_text()))
    return read_scalars(path)


def _convergence_from_events(path: Path, status: str, config: dict) -> dict:
    """For a completed run whose record predates `convergence`: the same rule (attnlab.run.convergence) applied
    to the val/loss curve of its TensorBoard events; {} without them."""
    steps = config.get("trainer.steps")
    if status != "completed" or not isinstance(steps, int) or not has_scalars(path):
        return {}
    return still_falling(scalars(path).get("val/loss", {}), steps)


def _refused(path: Path, metrics) -> bool:
    """A single command refused as bad input before it ran (a directory with only its refusal's metrics.json): no
    run. A refused job of a sweep stays: it is a failed cell of the sweep's grid. `metrics`: its metrics.json."""
    return (
        isinstance(metrics, dict)
        and str(metrics.get("error", "")).startswith("configuration:")
        and not (path / "run.json").exists()
        and not (path.parent / "multirun.yaml").exists()
    )


def _natural(p: Path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]  # 10_x after 2_x


def load_runs(sweep_dir) -> list[Run]:
    """Every run under `sweep_dir` (itself a run, a sweep, or a folder of sweeps), read from JSON."""
    runs = []
    for dirpath, dirnames, filenames in os.walk(sweep_dir):
        if "seeds.json" in filenames:  # trainer.vmap_seeds: one ordinary run per seed below
            dirnames[:] = sorted(d for d in dirnames if d.startswith("seed"))
            continue
        if {"metrics.json", "run.json"} & set(filenames):  # a bare .hydra/ is a job that never started
            path = Path(dirpath)
            metrics = _json(path / "metrics.json")  # read once: both the refusal check and the run need it
            if not _refused(path, metrics):
                runs.append(_read_run(path, metrics))
            dirnames.clear()  # checkpoints and the like live below a run
        else:
            dirnames.sort()
    return sorted(runs, key=lambda r: _natural(r.path))


def sort_key(v) -> tuple:
    """Sort key for mixed config values: numbers by value, then strings, None last."""
    if v is None:
        return (2, "")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (0, v)
    return (1, str(v))


def _determined(key: str, by: list[str], runs: list[Run]) -> bool:
    seen = {}
    for r in runs:
        k = tuple(r.config.get(b, MISSING) for b in by)
        if seen.setdefault(k, r.config.get(key, MISSING)) != r.config.get(key, MISSING):
            return False
    return True


def _axes(runs: list[Run]) -> tuple[list[str], list[str]]:
    """(group keys, drifted keys): see varying_keys; drifted keys exist in only some runs, with one value."""
    # Keys set on the command line are the sweep's axes: always kept. Any other varying key is dropped when
    # the kept keys determine it (normalizer.beta follows from normalizer=softmax|kl, for instance), or when
    # it is absent from some runs and has one value in the others: the config gained a key mid-sweep.
    runs = [r for r in runs if r.config]
    keys = sorted(set().union(*(r.config for r in runs))) if runs else []
    values = {k: {r.config.get(k, MISSING) for r in runs} for k in keys}
    varying = [k for k in keys if k != SEED and k not in OPERATIONAL and len(values[k]) > 1]
    swept = list(dict.fromkeys(k for r in runs for k in r.swept))
    kept, drifted = [k for k in swept if k in varying], []
    for k in sorted(set(varying) - set(kept), key=lambda k: ("." in k, k)):  # choices before their options
        if _determined(k, kept, runs):
            continue
        (drifted if MISSING in values[k] and len(values[k]) == 2 else kept).append(k)
    return kept, drifted


def varying_keys(runs: list[Run]) -> list[str]:
    """Config keys that vary across runs, minus the seed, OPERATIONAL keys and keys that follow from others."""
    return _axes(runs)[0]


def drifted_keys(runs: list[Run]) -> list[str]:
    """Keys present in only some runs (one value where present): the code changed during the sweep."""
    return _axes(runs)[1]


def parse_value(text: str):
    """A command-line value as Hydra reads it: int, float, bool, null, else the string."""
    low = text.strip().lower()
    if low in ("null", "none", "~"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def same_value(v, text: str) -> bool:
    """Whether config value `v` is what `text` names ("1e-3" names 0.001)."""
    p = parse_value(text)
    if isinstance(v, (int, float)) and isinstance(p, (int, float)) and not isinstance(v, bool):
        return math.isclose(v, p, rel_tol=1e-9)
    return v == p or str(v) == text
