"""A sweep's records in one file, `NAME.records.json.xz`: what the report reads of each run, kept after its directory.

The file is xz-compressed JSON, written with sorted keys and no timestamp, so the same sweep packs to the same bytes:
`command` (the report options it was packed with), `files` (relative path -> text of every run.json, metrics.json,
multirun.yaml, seeds.json and, beside no run.json, .hydra/*.yaml) and `scalars` (run directory -> {tag: [steps,
values]}: its TensorBoard scalars, in place of the event files; a string value is a float32 in its shortest form).
Read back, the files are unpacked into a temporary directory with each run's scalars in SCALARS, and the report reads
that directory as it reads a sweep (load.scalars reads SCALARS where there are no event files).
"""

from __future__ import annotations

import json
import lzma
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from attnlab.run.events import read_scalars

SUFFIX = ".records.json.xz"
SCALARS = "records.scalars.json"  # a run's scalars unpacked from a records file
FORMAT = 1
KEPT = frozenset({"run.json", "metrics.json", "multirun.yaml", "seeds.json"})
HYDRA = frozenset({"config.yaml", "hydra.yaml", "overrides.yaml"})  # kept where a run has no run.json
SKIPPED_DIRS = frozenset({"checkpoints", "report"})
FLOAT32_MAX = float(np.finfo(np.float32).max)


def is_records(path: Path) -> bool:
    """Whether `path` names a records file (by its suffix)."""
    return Path(path).name.endswith(SUFFIX)


def report_beside(path: Path) -> Path:
    """The report a records file writes, kept beside it: NAME.md for NAME.records.json.xz."""
    return Path(path).with_name(Path(path).name.removesuffix(SUFFIX) + ".md")


def _kept(dirpath: Path, name: str) -> bool:
    if name in KEPT:
        return True
    return dirpath.name == ".hydra" and name in HYDRA and not (dirpath.parent / "run.json").exists()


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _encode(value: float) -> float | str:
    """A float32 value as its shortest string (exact on reading back), any other as itself."""
    if not math.isfinite(value):
        return str(value)  # nan, inf, -inf: JSON has no number for them
    short = np.float32(value) if abs(value) <= FLOAT32_MAX else None
    return str(short) if short is not None and float(short) == value else value


def _decode(value: float | str) -> float:
    return float(np.float32(value)) if isinstance(value, str) else float(value)


def encode_scalars(scalars: dict[str, dict[int, float]]) -> dict[str, list[list]]:
    """read_scalars' {tag: {step: value}} as {tag: [steps, values]}."""
    return {tag: [list(curve), [_encode(v) for v in curve.values()]] for tag, curve in scalars.items()}


def decode_scalars(stored: dict[str, list[list]]) -> dict[str, dict[int, float]]:
    """encode_scalars' output read back as read_scalars returns it."""
    return {tag: {int(s): _decode(v) for s, v in zip(steps, values)} for tag, (steps, values) in stored.items()}


def collect(root: Path) -> tuple[dict[str, str], dict[str, dict]]:
    """(files, scalars) of the sweep under `root`, keyed by path relative to it."""
    files, scalars = {}, {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        files.update({_rel(here / f, root): (here / f).read_text() for f in filenames if _kept(here, f)})
        if any(f.startswith("events.out.tfevents.") for f in filenames):
            scalars[_rel(here, root)] = encode_scalars(read_scalars(here))
    return files, scalars


def pack(root: Path, out: Path, command: list[str]) -> Path:
    """Write the records of the sweep under `root` to `out`, with the report options `command`."""
    files, scalars = collect(Path(root))
    content = {"format": FORMAT, "command": command, "files": files, "scalars": scalars}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(lzma.compress(text.encode(), preset=9))
    return out


def read(path: Path) -> dict:
    """A records file's content: format, command, files, scalars."""
    return json.loads(lzma.decompress(Path(path).read_bytes()))


def command(path: Path) -> list[str]:
    """The report options a records file was packed with."""
    return read(path)["command"]


def unpack(path: Path, dest: Path) -> Path:
    """The records in `path` as a sweep directory under `dest`, each run's scalars in its SCALARS."""
    content = read(path)
    written = []
    for rel in [*content["files"], *content["scalars"]]:
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ValueError(f"{path}: the record {rel!r} points outside its sweep; records name paths inside it")
    for rel, text in content["files"].items():
        written.append(dest / rel)
        written[-1].parent.mkdir(parents=True, exist_ok=True)
        written[-1].write_text(text)
    for rel, stored in content["scalars"].items():
        written.append(dest / rel / SCALARS)
        written[-1].parent.mkdir(parents=True, exist_ok=True)
        written[-1].write_text(json.dumps(stored))
    for p in written:  # a record is never live: no run reads as written a moment ago
        os.utime(p, (0, 0))
    return dest


@contextmanager
def as_directory(source: Path) -> Iterator[Path]:
    """A sweep directory as itself; a records file unpacked into a temporary directory for the time of the block."""
    if not is_records(source):
        yield Path(source)
        return
    with tempfile.TemporaryDirectory(prefix="attnlab-records-") as tmp:
        yield unpack(source, Path(tmp) / "sweep")
