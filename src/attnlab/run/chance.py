"""Results that cannot be told from chance: a test accuracy within binomial noise of the task's baseline.

Noise, concretely: if every one of the n scored test targets were answered correctly with the baseline's
probability p0 (chance or majority accuracy, `Task.baseline`), the accuracy would be Binomial(n, p0)/n.
An accuracy at or below that distribution's 97.5th percentile is within noise of the baseline (a one-sided
2.5% test against "no better than the baseline"). Targets inside one sequence are not independent (MQAR
asks several queries of one context), so the interval is, if anything, too narrow: a flagged result is
certainly indistinguishable from the baseline, an unflagged one close to it deserves more seeds.
"""

from __future__ import annotations

import math

import numpy as np

LEVEL = 0.975  # the percentile of the chance-level accuracy below which a result is "within noise"
METRICS = ("accuracy", "accuracy_ts")  # test/<metric> compared with baseline/<baseline metric> (accuracy)


def scored_targets(task, split: str = "test") -> int:
    """How many targets of a split count (weight > 0): the n of the binomial."""
    return int(np.count_nonzero(np.asarray(task.splits[split].weights) > 0))


def threshold(p0: float, n: int) -> float:
    """The accuracy at the LEVEL percentile of Binomial(n, p0)/n."""
    return _binomial_quantile(LEVEL, n, p0) / n


def lower_threshold(p0: float, n: int) -> float:
    """The accuracy at the 1 − LEVEL percentile of Binomial(n, p0)/n: below it, a result is worse than guessing
    (the model learnt to avoid the answer, or a bug), not merely at chance."""
    return _binomial_quantile(1 - LEVEL, n, p0) / n


def _binomial_quantile(q: float, n: int, p: float) -> float:
    """Binomial(n, p)'s q-quantile. scipy.stats is imported here, not with the module: only a finished run's summary
    asks for a quantile, and refusals and --help should not pay its import (cost: tests/test_imports.py)."""
    from scipy import stats

    return float(stats.binom.ppf(q, n, p))


def flags(final: dict[str, float], baseline: dict[str, float], n: int) -> dict[str, dict]:
    """{test/<metric>: {baseline, n, threshold, within_noise}} for each accuracy metric the run has."""
    p0 = baseline.get("baseline/accuracy")
    if p0 is None or not n or not 0 <= p0 <= 1:
        return {}
    limit, lower = threshold(p0, n), lower_threshold(p0, n)
    out = {}
    for metric in METRICS:
        value = final.get(f"test/{metric}")
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[f"test/{metric}"] = {
                "baseline": p0,
                "n": n,
                "threshold": limit,
                "within_noise": value <= limit,
                "lower": lower,
                "below": value < lower,
            }
    return out


def describe(flag: dict) -> str:
    """How the run summary marks a flagged metric ('' when it is not flagged)."""
    if flag.get("below"):
        return f"below chance (< {flag['lower']:.4f}: {1 - LEVEL:.1%} point of Binomial(n={flag['n']}, baseline)/n)"
    if flag.get("within_noise"):
        return f"≈chance (<= {flag['threshold']:.4f}: {LEVEL:.1%} point of Binomial(n={flag['n']}, baseline)/n)"
    return ""
