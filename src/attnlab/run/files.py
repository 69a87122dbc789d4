"""The files a run keeps in its directory (run.json, metrics.json, seeds.json), and its HParams row."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from attnlab.run.convergence import still_falling, val_curve
from attnlab.run.record import FINISHED, environment, read_json, write_json
from attnlab.run.summary import print_summary


def hparams_of(cfg: DictConfig, choices: dict[str, str]) -> dict[str, Any]:
    """Every config choice and scalar option, flat, for TensorBoard's HParams tab (seed as a string)."""
    from attnlab.board.hparams import ALIASES

    flat = {ALIASES.get(g, g): str(choices.get(g)) for g in ("normalizer", "task", "head", "model", "accelerator")}
    for group in ("normalizer", "task", "model", "optim", "trainer"):
        for k, v in OmegaConf.to_container(cfg[group], resolve=True).items():
            if not k.startswith("_") and isinstance(v, (int, float, str, bool)):
                flat[f"{group}.{k}"] = v
            elif isinstance(v, list):  # e.g. model.layer_normalizers: the layout as one string
                flat[f"{group}.{k}"] = ",".join(map(str, v))
    flat["seed"] = str(cfg.seed)
    return flat


def finished_with(run_dir: Path, resolved: dict) -> str | None:
    """The final status (FINISHED) of the run in run_dir if it ran exactly this resolved config (resume flag
    aside), else None; under trainer.vmap_seeds every seed must have finished."""
    try:
        if (run_dir / "seeds.json").exists():
            info = read_json(run_dir / "seeds.json")
            found = {v["status"] for v in info["seeds"].values()}
            old = info["config"]
        else:
            found = {read_json(run_dir / "metrics.json")["status"]}
            old = read_json(run_dir / "run.json")["config"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    strip = lambda c: {**c, "trainer": {k: v for k, v in c["trainer"].items() if k != "resume"}}  # noqa: E731
    if not found or not found <= set(FINISHED) or strip(old) != strip(resolved):
        return None
    return "diverged" if "diverged" in found else "completed"


def compute_record(net, seq_len: int, precision: str) -> dict[str, Any]:
    """Each layer's attention implementation and the matmul precision set (accelerator.apply_matmul_precision);
    printed, and kept in run.json."""

    from attnlab.steps import probes_per_layer

    impls = net.body.attention_impl(seq_len)
    print(f"attnlab: attention_impl per layer: {', '.join(impls)}; matmul_precision: {precision}", file=sys.stderr)
    probed = probes_per_layer(net)
    without = [i for i, ok in enumerate(probed) if not ok]
    if without:  # say why those layers have no score_grad (steps.make_stats_step)
        names = ", ".join(f"{i} ({type(net.body.blocks[i].attn.normalizer).__name__})" for i in without)
        print(f"attnlab: score_grad not logged for layer(s) {names}: no score matrix", file=sys.stderr)
    return {
        "attention_impl": impls,
        "matmul_precision": precision,
        "compute_dtype": np.dtype(net.body.dtype).name,
        "score_grad_layers": [i for i, ok in enumerate(probed) if ok],
    }


def record_refused(run_dir: Path, record: dict[str, Any], exc: Exception) -> dict[str, Any]:
    """A sweep job whose configuration was refused: a failed cell, its metrics.json written where it can be."""
    record.update(status="failed", error=f"configuration: {exc}")
    if os.access(run_dir, os.W_OK):
        write_json(run_dir / "metrics.json", record)
    return record


def record_failure(run_dir: Path, record: dict[str, Any]) -> None:
    """The exception being handled as a failed run: error.txt (traceback), metrics.json, one line naming both."""
    exc = sys.exc_info()[1]
    (run_dir / "error.txt").write_text(traceback.format_exc())
    record.update(status="failed", error=f"{type(exc).__name__}: {exc}")
    write_json(run_dir / "metrics.json", record)
    print(f"attnlab: run failed: {record['error']} (traceback in {run_dir / 'error.txt'})", file=sys.stderr)


def write_run_json(
    seeds: list[int],
    run_dirs: list[Path],
    resolved: dict,
    choices: dict,
    overrides: list,
    task,
    compute: dict | None = None,
) -> None:
    """run.json in each seed's directory: its config, choices, overrides, environment (and lm corpus), and
    `compute` (run.files.compute_record: attention_impl per layer, matmul_precision, compute_dtype), and where the
    training data lives (`train_data`: device, or host-stream for an lm text over task.device_text_bytes)."""
    env = environment()
    for seed, d in zip(seeds, run_dirs):
        d.mkdir(parents=True, exist_ok=True)
        corpus = {"corpus": task.corpus} if getattr(task, "corpus", None) else {}  # the lm task's text identity
        write_json(
            d / "run.json",
            {
                "config": {**resolved, "seed": seed},
                "choices": choices,
                "overrides": overrides,
                "env": env,
                **corpus,
                **(compute or {}),
                "train_data": task.train_data,
            },
        )


def write_results(
    seeds: list[int], run_dirs: list[Path], records: list[dict], run_dir: Path, resolved: dict, *, print_summaries: bool
) -> None:
    """metrics.json per seed (and its summary on stdout), diverged.json beside it for a seed whose record holds
    a diagnosis (train.final.diagnose; kept out of metrics.json); seeds.json in run_dir when several seeds ran."""
    for d, rec in zip(run_dirs, records):
        diagnosis = rec.pop("diagnosis", None)
        if diagnosis is not None:
            write_json(d / "diverged.json", diagnosis)
        if rec.get("status") == "completed":  # is its val loss still falling? (attnlab.run.convergence)
            rec["convergence"] = still_falling(val_curve(d), resolved.get("trainer", {}).get("steps", 0))
        write_json(d / "metrics.json", {**rec, "run_dir": str(d)})
        if print_summaries:
            print_summary({**rec, "run_dir": str(d)})
    if len(records) > 1:
        write_json(
            run_dir / "seeds.json",
            {
                "config": resolved,
                "seeds": {
                    str(s): {"status": r["status"], "run_dir": str(d)} for s, d, r in zip(seeds, run_dirs, records)
                },
            },
        )
