"""A sweep's definition: its multirun.yaml (the one place that reads it), the keys it sweeps and the command that
resumes it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def multirun_config(sweep_dir: Path | str) -> Any:
    """The sweep's multirun.yaml (Hydra's sweeper writes it before any job), None if it cannot be read: the one
    place that reads it (swept keys and values, the resume command, the report's expected jobs)."""
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


def sweep_values(sweep_dir: Path | str | None) -> dict[str, list[str]]:
    """{key: the values it takes} of every key a multirun sweeps, Hydra's own keys left out, as written on the
    command line or in the sweeper's params; {} outside a sweep (None) or where multirun.yaml cannot be read.
    The HParams experiment declares them (board.hparams.declare)."""
    saved = None if sweep_dir is None else multirun_config(sweep_dir)
    if saved is None:
        return {}
    return {
        o.key_or_group: list(o.sweep_string_iterator())
        for o in sweep_overrides(saved)
        if o.is_sweep_override() and not o.key_or_group.startswith("hydra")
    }


def program(argv0: str) -> list[str]:
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
    return shlex.join([*program(argv0), "-m", *hydra_cfg.overrides.task, *hydra_args, f"hydra.sweep.dir={sweep_dir}"])
