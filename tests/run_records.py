"""Run directories as the trainer leaves them, written by hand (no training): what attnlab.report and the run
summaries read."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

NORM_CFG = {  # the options differ by normalizer, so they vary across runs only as a consequence of the choice
    "softmax": {"_target_": "attnlab.normalizers.Softmax", "beta": None, "learnable": True},
    "kl": {"_target_": "attnlab.normalizers.KL", "beta": None, "learnable": True, "prior": "recency"},
    "linear": {"_target_": "attnlab.normalizers.Linear", "feature_map": "elu1", "eps": 1e-6},
    "sigmoid": {"_target_": "attnlab.normalizers.Sigmoid", "bias": "auto"},
}


def config(normalizer, lr, seed, d_model=16):
    return {
        "normalizer": NORM_CFG[normalizer],
        "optim": {"lr": lr, "warmup_steps": 10},
        "task": {"_target_": "attnlab.tasks.MQAR", "seq_len": 16, "seed": 0, "default_head": "softmax_ce"},
        "model": {"d_model": d_model, "heads": 2},
        "trainer": {"steps": 4, "checkpoint_every": 500},
        "seed": seed,
        "compile_cache": None,
    }


def write_run(
    root: Path,
    name: str,
    normalizer: str,
    lr: float,
    seed: int,
    final: dict | None,
    *,
    status="completed",
    record="run.json",
    best=None,
    d_model=16,
    overrides=True,
    extra: dict | None = None,
    env: dict | None = None,
) -> Path:
    """One run directory as the trainer leaves it; record: run.json | hydra (failed early) | none. `extra` adds
    metrics.json fields (convergence, plateaus), `env` run.json's env fields (git, versions, devices)."""
    path = root / name
    path.mkdir(parents=True)
    cfg = config(normalizer, lr, seed, d_model)
    choices = {
        "normalizer": normalizer,
        "task": "mqar",
        "head": "softmax_ce",
        "model": "tiny",
        "optim": "adamw",
        "trainer": "default",
        "hydra/launcher": "basic",
    }
    ovr = [f"normalizer={normalizer}", f"optim.lr={lr}", f"seed={seed}"] if overrides else []
    if record == "run.json":  # env differs in every run and must not become a group key
        env = {"host": "h", "command": f"python -m attnlab {name}", "run_dir": str(path), **(env or {})}
        (path / "run.json").write_text(json.dumps({"config": cfg, "choices": choices, "overrides": ovr, "env": env}))
    elif record == "hydra":
        (path / ".hydra").mkdir()
        (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
        (path / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"choices": choices}}}))
        (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(ovr))
    metrics = {"status": status, "error": None if status == "completed" else "boom", "run_dir": str(path)}
    if final is not None:
        metrics.update(
            final=final,
            best=best or {**final, "step": 4},
            baseline={"baseline/accuracy": 0.125},
            headline="test/accuracy",
            baseline_labels={"test/accuracy": {"baseline/accuracy": "chance"}},
        )
    (path / "metrics.json").write_text(json.dumps({**metrics, **(extra or {})}))
    return path
