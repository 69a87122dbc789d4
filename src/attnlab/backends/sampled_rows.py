"""The statistics of a long logging step, on a sample of query rows: which rows, and from which length on."""

from __future__ import annotations

import numpy as np

# From T·S = 1024² on, a logging step computes its statistics on STATS_ROWS sampled query rows (no T×S array)
# wherever the plain step keeps none, and the score gradient (a B×N×T×S array) is not logged.
SAMPLED_MIN_TS = 1024 * 1024
# Statistics of a step at length are computed on this many evenly spaced query rows (all if T is smaller).
STATS_ROWS = 128


def at_length(T: int, S: int) -> bool:
    """Whether a logging step at T queries and S keys samples its statistics rows and logs no score gradient."""
    return T * S >= SAMPLED_MIN_TS


def stats_rows(T: int, R: int | None = None) -> np.ndarray:
    """R (default STATS_ROWS) evenly spaced query rows, first and last included (all rows when T ≤ R)."""
    R = STATS_ROWS if R is None else R
    return np.unique(np.round(np.linspace(0, T - 1, min(R, T))).astype(int))
