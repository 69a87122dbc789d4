"""What a run records: atomic JSON files read without pickle, the environment (git, package versions, devices)
and the outcomes a run ends with.

Which files a run keeps and what goes in them is run/files.py's; this module only writes and reads JSON."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# The outcomes a run's metrics.json records (`interrupted` is a stop, not an outcome: the run resumes).
STATUSES = ("completed", "diverged", "failed")
FINISHED = ("completed", "diverged")  # final outcomes: a resumed sweep skips them (a diverged run would diverge again)
PACKAGES = ("attnlab", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "hydra-core", "tensorboardX", "numpy")


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename), so a killed run never leaves half a file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=float))
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def git_state() -> dict[str, Any]:
    """SHA and dirty flag of the attnlab checkout; outside one (a wheel install), why, and the installed version."""
    package = Path(__file__).resolve().parents[1]  # attnlab/, this module being attnlab/run/record.py
    root = package.parents[1]  # a checkout is <root>/src/attnlab; a wheel is site-packages/attnlab
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=package, capture_output=True, text=True, check=True
        ).stdout.strip()
        # A venv inside some other repository must not record that repository's SHA as attnlab's.
        if package.parent.name != "src" or Path(top).resolve() != root:
            raise LookupError
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        return {"sha": sha, "dirty": dirty}
    except (OSError, subprocess.CalledProcessError, LookupError):
        try:
            version = metadata.version("attnlab")
        except metadata.PackageNotFoundError:
            version = None
        return {"sha": None, "dirty": None, "note": "not a git checkout", "version": version}


def environment() -> dict[str, Any]:
    """Versions, devices, git state and the command line of this process."""
    import jax

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "git": git_state(),
        "versions": versions,
        "python": platform.python_version(),
        "devices": [str(d) for d in jax.devices()],
        "backend": jax.default_backend(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "host": platform.node(),
    }
