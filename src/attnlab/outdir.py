"""Refuse, in one line, a run or sweep directory that cannot be created or written, before Hydra makes it."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from attnlab import exits

# Run directory -> its topmost ancestor that did not exist before Hydra made it in this process: a refused
# run removes its own (remove_created), never one the user pointed at (hydra.run.dir=<a run> trainer.resume=true).
CREATED: dict[Path, Path] = {}


def remove_created(run_dir: Path) -> None:
    """Remove a run directory this process created, and its new parents while empty (another launch may share them)."""
    run_dir = Path(run_dir).absolute()
    top = CREATED.get(run_dir)
    if top is None:
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in run_dir.parents:
        if not parent.is_relative_to(top):
            break
        try:
            parent.rmdir()
        except OSError:  # not empty: a concurrent run lives there
            break


def unwritable_reason(path: Path) -> str | None:
    """Why `path` cannot be created (or written, if it exists) — None when it can.

    Probes by creating and removing a directory in the nearest existing ancestor: permission bits
    say nothing for root, nor for /proc, read-only mounts or an ancestor that is a regular file.
    """
    path = Path(path).expanduser().absolute()
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".attnlab-writable-", dir=ancestor))
    except OSError as exc:
        return f"cannot create anything in {ancestor} ({exc.strerror or exc})"
    return None


def check(key: str, path: Any) -> None:
    """Exit 2 with one line naming the key and the directory when it cannot be created or written."""
    reason = unwritable_reason(Path(str(path)))
    if reason:
        print(
            f"attnlab: error: {key}={path} cannot be created or written: {reason}; "
            f"allowed: a directory path you can write to",
            file=sys.stderr,
        )
        sys.exit(exits.REFUSED)


class OutputDirCheck(Callback):
    """Hydra calls these after composing the config and before it creates hydra.run.dir / hydra.sweep.dir."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        check("hydra.run.dir", config.hydra.run.dir)
        run_dir = Path(str(config.hydra.run.dir)).absolute()
        if not run_dir.exists():
            CREATED[run_dir] = next(p for p in reversed([run_dir, *run_dir.parents]) if not p.exists())

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        check("hydra.sweep.dir", config.hydra.sweep.dir)
