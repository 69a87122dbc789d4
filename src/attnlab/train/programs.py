"""Compiled programs kept for this process's later runs of the same program.

Hydra's basic launcher runs a sweep's jobs one after the other in one process. A job whose config equals an earlier
job's but for the values its optimizer injects (attnlab.config.assembly.program_key: a learning rate, a weight decay,
a warmup, a clip) and whose programs take arguments of the same structure, shapes, dtypes and shardings runs the
earlier job's compiled programs: it traces, lowers and compiles nothing. Without a key (`fit` called from Python)
every run compiles its own; across processes the persistent compilation cache serves the XLA part.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, TypeVar

import jax

# Entries kept (a run keeps two: its steps and its evaluation programs): Hydra's basic sweeper varies the last swept
# key fastest (a screen's rates within each cell), so a later rate finds its cell's programs among the last few.
KEEP = 8

T = TypeVar("T")
_kept: OrderedDict[Hashable, object] = OrderedDict()


def kept(key: Hashable | None, part: str, args, build: Callable[[], T]) -> T:
    """build()'s result, built once per (key, part, the signature of the programs' arguments `args`) in this process
    (the KEEP latest); key None: built every time."""
    if key is None:
        return build()
    full = (key, part, _signature(args))
    if full not in _kept:
        _kept[full] = build()
        while len(_kept) > KEEP:
            _kept.popitem(last=False)
    _kept.move_to_end(full)
    return _kept[full]


def _signature(trees) -> tuple:
    """What a compiled program is called with: the trees' structure and each leaf's shape, dtype and sharding."""
    leaves, treedef = jax.tree.flatten(trees)
    return treedef, tuple((tuple(x.shape), str(x.dtype), x.sharding) for x in leaves)


def clear() -> None:
    """Forget every kept program (tests/conftest.py: a test may patch what a program traces)."""
    _kept.clear()
