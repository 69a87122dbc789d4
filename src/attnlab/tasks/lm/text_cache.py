"""The lm training text as a read-only memory-mapped file (train_data: host-stream), written once per content."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from attnlab.checks import ConfigError


def cache_dir() -> Path:
    """$ATTNLAB_CACHE, else $XDG_CACHE_HOME/attnlab, else ~/.cache/attnlab."""
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("ATTNLAB_CACHE") or xdg / "attnlab").expanduser()


def memmap_text(text_U8: np.ndarray) -> np.memmap:
    """`text_U8` as a read-only np.memmap of <cache_dir>/text/<blake2b of the bytes>.u8.

    The name is the content's hash, so the same text (same corpus, split and seed) reuses its file and a
    different one never does; the file is written to a temporary name and renamed, so a run killed while
    writing leaves no truncated file under the final name.
    """
    data = np.ascontiguousarray(text_U8, np.uint8)
    path = cache_dir() / "text" / f"{hashlib.blake2b(memoryview(data), digest_size=16).hexdigest()}.u8"
    if not (path.exists() and path.stat().st_size == data.nbytes):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            data.tofile(tmp)
            os.replace(tmp, path)
        except OSError as exc:
            raise ConfigError(
                f"the training text cannot be cached in {path.parent} ({exc.strerror or exc}); "
                "allowed: a writable ATTNLAB_CACHE directory"
            ) from None
    return np.memmap(path, np.uint8, mode="r")
