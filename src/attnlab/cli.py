"""Hydra entry points: a run's config built into its objects (through attnlab.config), trained and recorded."""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from attnlab import checks, exits, outdir, progress
from attnlab.config import assembly, composition, registry
from attnlab.run import chance
from attnlab.run.convergence import at_plateaus
from attnlab.run.files import (
    compute_record,
    finished_with,
    hparams_of,
    record_failure,
    record_refused,
    write_results,
    write_run_json,
)
from attnlab.run.summary import smaller_lr
from attnlab.sweep import definition, naming, signals

ConfigError = checks.ConfigError  # bad input: one line, exits.REFUSED; any other exception is a failed run (a bug)
_require = checks.require


@progress.in_sweep_labelled  # a sweep job's lines carry its name
def run(cfg: DictConfig) -> dict[str, Any]:
    """Run one experiment in Hydra's output directory and write its record there."""
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    choices = dict(hc.runtime.choices)
    record: dict[str, Any] = {"status": "failed", "run_dir": str(run_dir)}
    resolved = OmegaConf.to_container(cfg, resolve=True)
    done = finished_with(run_dir, resolved) if multirun else None
    if done:  # a resumed sweep runs each job once: completed and diverged jobs are final
        print(f"attnlab: {run_dir} already {done} with the same config; skipped", file=sys.stderr)
        return {"status": done, "run_dir": str(run_dir), "skipped": True}
    has_checkpoint = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
    if multirun and has_checkpoint:  # re-running a sweep continues its unfinished runs
        cfg.trainer.resume = True
    try:
        task, nets, tx, loop, compute = _build_run(cfg, hc, run_dir, choices, has_checkpoint)
    except ConfigError as exc:
        return _refused(run_dir, record, exc, multirun)
    except Exception:  # not bad input: a bug while building the run, so a failed run with its traceback
        return _failed(run_dir, record, multirun)
    seeds = [cfg.seed + i for i in range(len(nets))]
    run_dirs = [run_dir] if len(nets) == 1 else [run_dir / f"seed{s}" for s in seeds]
    try:
        if multirun:
            loop = type(loop)(**{**loop.__dict__, "progress": progress.job_mode(loop.progress)})
        writer = _writes_files()
        if writer:
            write_run_json(seeds, run_dirs, resolved, choices, list(hc.overrides.task), task, compute)
        from attnlab.board.hparams import declare

        hparams = [{**hparams_of(cfg, choices), "seed": str(seed)} for seed in seeds]
        swept = definition.sweep_values(hc.sweep.dir if multirun else None)
        declared = declare(hparams[0], swept, seeds, registry.catalogue(swept))
        with tempfile.TemporaryDirectory(prefix="attnlab-follower-") as scratch:
            log_dirs = run_dirs if writer else [Path(scratch) / d.name for d in run_dirs]
            records = _train(cfg, task, nets, tx, loop, log_dirs, run_dir, hparams, declared)
    except Exception:  # a failed run records why and lets a sweep go on
        return _failed(run_dir, record, multirun)
    for r in records:  # is each test accuracy distinguishable from the task's baseline? (attnlab.run.chance)
        r["chance"] = chance.flags(r.get("final", {}), r.get("baseline", {}), chance.scored_targets(task))
        r["plateaus"] = at_plateaus(r.get("final", {}), task.plateaus())  # attnlab.run.convergence
    if writer:
        write_results(seeds, run_dirs, records, run_dir, resolved, print_summaries=not multirun)
    _exit_unless_finished(records, run_dirs, run_dir, resolved, hc.sweep.dir if multirun else None)
    return {**records[0], "run_dir": str(run_dirs[0])}


def _build_run(cfg: DictConfig, hc, run_dir: Path, choices: dict, has_checkpoint: bool):
    """(task, nets, tx, loop, compute record) of a run, the process-wide settings applied; ConfigError on bad input,
    an attention implementation that cannot run included (refused as the model is built)."""
    _require(os.access(run_dir, os.W_OK), f"run directory {run_dir} is not writable")
    _require(
        not cfg.trainer.resume or has_checkpoint,
        f"trainer.resume=true but {run_dir / 'checkpoints'} does not exist or is empty "
        f"(resume needs hydra.run.dir=<the run's directory>)",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task, nets, tx, loop, precision = assembly.build_run(cfg, choices, hc.launcher)
    choices["head"] = choices.get("head") or task.default_head
    for w in caught:
        print(f"attnlab: warning: {w.message}", file=sys.stderr)
    return task, nets, tx, loop, compute_record(nets[0], task.seq_len, precision)


def _refused(run_dir: Path, record: dict[str, Any], exc: ConfigError, multirun: bool) -> dict[str, Any]:
    """Bad input: one line; a refused command leaves nothing behind and exits, a refused sweep job is a failed cell."""
    print(f"attnlab: error: {exc}", file=sys.stderr)
    if not multirun:
        outdir.remove_created(run_dir)
        sys.exit(exits.REFUSED)
    return record_refused(run_dir, record, exc)


def _exit_unless_finished(records: list[dict], run_dirs: list[Path], run_dir: Path, resolved: dict, sweep_dir) -> None:
    """A single run that diverged exits with exits.DIVERGED; an interrupted one stops its sweep (sweep_dir: the
    sweep's directory, None for a single run) or exits with exits.INTERRUPTED."""
    if sweep_dir is None and any(r["status"] == "diverged" for r in records):
        d, r = next((d, r) for d, r in zip(run_dirs, records) if r["status"] == "diverged")
        print(
            f"attnlab: run diverged {r['error']}; {smaller_lr({'config': resolved})} (record in {d / 'metrics.json'})",
            file=sys.stderr,
        )
        sys.exit(exits.DIVERGED)
    stopped = [r for r in records if r["status"] == "interrupted"]
    if stopped and sweep_dir is not None:  # one Ctrl-C/SIGTERM stops the sweep
        signals.interrupted(run_dir, sweep_dir)
    if stopped:  # the summary above ends with the resume command
        print(f"attnlab: run {stopped[0]['error']}; checkpoint saved in {run_dir / 'checkpoints'}", file=sys.stderr)
        sys.exit(exits.INTERRUPTED)


def _writes_files() -> bool:
    """Whether this process writes the run's files (run.json, TensorBoard, metrics.json): process 0 of a run
    that spans processes (accelerator.distributed), as SLURM's task 0. The others run the same programs (each
    step is one SPMD program over every process's devices) and log to a scratch directory they delete;
    checkpoints are orbax's, which writes each array once from the processes together."""
    import jax

    return not jax.distributed.is_initialized() or jax.process_index() == 0


def _failed(run_dir: Path, record: dict[str, Any], multirun: bool) -> dict[str, Any]:
    """The exception being handled as a failed run (run.files.record_failure; another process than the writer
    prints its traceback); a single run exits 1."""
    if _writes_files():
        record_failure(run_dir, record)
    else:
        traceback.print_exc()
    if not multirun:
        sys.exit(exits.FAILED)
    return record


def _train(cfg, task, nets, tx, loop, run_dirs: list[Path], checkpoint_dir: Path, hparams: list[dict], declared: dict):
    from attnlab.accelerator import data_mesh
    from attnlab.train import fit

    return fit(
        nets,
        task,
        tx,
        loop,
        mesh=data_mesh(),
        run_dirs=run_dirs,
        checkpoint_dir=checkpoint_dir,
        hparams=hparams,
        declared=declared,
        program_key=assembly.program_key(cfg),
    )


# The process id makes two launches in the same microsecond still land in different directories. Cached like
# Hydra's own `now`: Hydra copies the launching process's resolver cache into every job's config
# (ConfigLoaderImpl.load_sweep_config), so joblib workers and submitit jobs resolve hydra.sweep.dir to the
# directory the sweep printed, not to one named after their own process.
OmegaConf.register_new_resolver("attnlab_pid", os.getpid, replace=True, use_cache=True)
OmegaConf.register_new_resolver("attnlab_job", naming.job_name, replace=True)


@hydra.main(config_path=str(registry.CONFIG_DIR), config_name="train", version_base="1.3")
def _hydra_train(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:  # a Ctrl-C/SIGTERM from here on ends with the resume command (train_main)
        signals.job_started(hc.runtime.output_dir, hc.sweep.dir)
    else:
        signals.RUN["run_dir"] = hc.runtime.output_dir
    registry.use_sources(hc.runtime.config_sources)  # a worker process sees the user's config directories too
    run(cfg)
    signals.check_pending()  # a signal whose KeyboardInterrupt was swallowed stops the sweep after its job


def train_main() -> None:
    """Console script `attnlab-train`."""
    multirun = signals.multirun_argv(sys.argv[1:])
    try:
        # Composing refuses bad input before jax loads; then jax loads, before any job: its start-up (jaxlib's MLIR
        # initialisation runs Python called from C++) a KeyboardInterrupt must not break into. A signal waits for
        # either (signals.signals_held), then is an interrupt before any job.
        if signals.signals_held(composition.compose_or_exit)(sys.argv[1:]):
            signals.signals_held(_load_jax)()
        _hydra_train()
    except KeyboardInterrupt:  # outside the step loop (start-up, compile, between jobs): no checkpoint to save
        signals.interrupted_outside_a_job(multirun, sys.argv)
    except SystemExit as exc:  # Hydra reports an error of its own when the KeyboardInterrupt broke its work mid-way
        if exc.code not in (0, None) and signals.pending():
            signals.interrupted_outside_a_job(multirun, sys.argv)
        raise


def _load_jax() -> None:
    """Import jax and flax (train_main: with signals held, before any job)."""
    import jax  # noqa: F401
    from flax import nnx  # noqa: F401


def report_main() -> None:
    """Console script `attnlab-report` (see attnlab.report.cli)."""
    from attnlab.report.cli import main

    main()


def check_main() -> None:
    """Console script `attnlab-check` (see attnlab.config.check)."""
    from attnlab.config.check import main

    main()
