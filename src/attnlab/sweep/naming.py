"""Job directory names: the swept values of each job (hydra.sweep.subdir's `attnlab_job` resolver)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from attnlab.sweep.definition import swept_keys

MAX_NAME = 120  # characters of swept values in a job directory name; longer ones end in a hash


def job_name(num: int, sweep_dir: str, overrides: list[str]) -> str:
    """The `attnlab_job` resolver of hydra.sweep.subdir: named_job with the sweep's swept keys."""
    return named_job(num, overrides, swept_keys(Path(sweep_dir)))


def named_job(num: int, overrides: list[str], swept: set[str] | None) -> str:
    """`<num>_<key=value,...>` of the swept keys (every override when None), e.g. `3_normalizer=kl,seed=1`."""
    parts = [o for o in overrides if swept is None or o.split("=", 1)[0].lstrip("+~") in swept]
    name = ",".join(parts).replace("/", "-")
    if len(name) > MAX_NAME:
        name = name[:MAX_NAME] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{num}_{name}" if name else str(num)
