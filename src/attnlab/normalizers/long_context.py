"""When attention goes blockwise, and the statistics of a long step on a sample of query rows."""

from __future__ import annotations

import numpy as np

from attnlab import checks

# `impl: auto` goes blockwise (where cuDNN does not apply) once T·S reaches this (T = S = 1024;
# see BENCHMARKS.md, attention).
AUTO_MIN_TS = 1024 * 1024
# Statistics of a blockwise step are computed on this many evenly spaced query rows (all if T is smaller).
STATS_ROWS = 128


def check_block_size(block_size) -> int:
    """A validated `normalizer.block_size`."""
    return checks.integer("normalizer.block_size", block_size, 1)


def skip_score_probe(T: int, S: int) -> bool:
    """The score probe (a B×N×T×S array) is not built once T·S ≥ AUTO_MIN_TS: score_grad is not logged."""
    return T * S >= AUTO_MIN_TS


def stats_rows(T: int, R: int | None = None) -> np.ndarray:
    """R (default STATS_ROWS) evenly spaced query rows, first and last included (all rows when T ≤ R)."""
    R = STATS_ROWS if R is None else R
    return np.unique(np.round(np.linspace(0, T - 1, min(R, T))).astype(int))
