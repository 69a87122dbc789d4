"""When attention goes blockwise, and the statistics of a long step on a sample of query rows."""

from __future__ import annotations

import numpy as np

from attnlab.checks import ConfigError


# `blockwise: auto` goes blockwise once T·S reaches this (T = S = 1024; see BENCHMARKS.md, attention).
AUTO_MIN_TS = 1024 * 1024
# Statistics of a blockwise step are computed on this many evenly spaced query rows (all if T is smaller).
STATS_ROWS = 128


def check_blockwise_options(blockwise, block_size) -> tuple:
    """Validated (blockwise, block_size) from a normalizer's YAML."""
    if not (blockwise is True or blockwise is False or blockwise == "auto"):
        raise ConfigError(f"normalizer.blockwise={blockwise!r} not allowed; allowed: auto, true, false")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"normalizer.block_size={block_size!r} not allowed; allowed: an integer >= 1")
    return blockwise, block_size


def use_blockwise(blockwise, T: int, S: int) -> bool:
    """`blockwise`: true | false | "auto" (T·S ≥ AUTO_MIN_TS)."""
    return T * S >= AUTO_MIN_TS if blockwise == "auto" else bool(blockwise)


def skip_score_probe(T: int, S: int) -> bool:
    """The score probe (a B×N×T×S array) is not built once T·S ≥ AUTO_MIN_TS: score_grad is not logged."""
    return T * S >= AUTO_MIN_TS


def stats_rows(T: int, R: int | None = None) -> np.ndarray:
    """R (default STATS_ROWS) evenly spaced query rows, first and last included (all rows when T ≤ R)."""
    R = STATS_ROWS if R is None else R
    return np.unique(np.round(np.linspace(0, T - 1, min(R, T))).astype(int))
