"""Statistics of one metric over seeds: bootstrap CI, paired comparison to a baseline, lr selection."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from attnlab.report.load import LR, Run, sort_key

HIGHER_IS_BETTER = ("accuracy", "accuracy_ts", "r2")  # metric name endings where larger wins


def bootstrap_ci(x, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (Efron); NaN below two values."""
    x = np.asarray(x, np.float64)
    if len(x) < 2:
        return math.nan, math.nan
    means = x[np.random.default_rng(seed).integers(0, len(x), (n_boot, len(x)))].mean(axis=1)
    lo, hi = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


@dataclass
class Stat:
    """One metric in one cell: seeds' mean ± std, bootstrap CI and the paired comparison to the baseline."""

    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    by_seed: dict = field(default_factory=dict)
    n_pairs: int = 0
    diff_mean: float = math.nan
    diff_std: float = math.nan
    t: float = math.nan
    p: float = math.nan
    within_noise: bool | None = None


def cell_stat(runs: list[Run], metric: str, which: str, n_boot: int, seed: int) -> Stat:
    vals = [(r.seed, v) for r in runs if (v := r.value(metric, which)) is not None]
    x = np.array([v for _, v in vals])
    by_seed: dict = {}
    for s, v in vals:
        by_seed.setdefault(s, []).append(v)
    lo, hi = bootstrap_ci(x, n_boot, seed)
    return Stat(n=len(x), mean=float(x.mean()) if len(x) else math.nan,
                std=float(x.std(ddof=1)) if len(x) > 1 else math.nan, ci_low=lo, ci_high=hi,
                by_seed={s: float(np.mean(v)) for s, v in by_seed.items()})


def compare(stat: Stat, base: Stat) -> None:
    """Paired t-test of a cell against its baseline cell on the seeds both completed."""
    from scipy import stats

    seeds = sorted(set(stat.by_seed) & set(base.by_seed), key=sort_key)
    x = np.array([stat.by_seed[s] for s in seeds])
    y = np.array([base.by_seed[s] for s in seeds])
    stat.n_pairs = len(seeds)
    if not seeds:
        return
    d = x - y
    stat.diff_mean = float(d.mean())
    if len(seeds) > 1:
        stat.diff_std = float(d.std(ddof=1))
        res = stats.ttest_rel(x, y)
        # identical pairs make ttest_rel 0/0 = nan; no difference at all is p = 1
        stat.t, stat.p = (0.0, 1.0) if not d.any() else (float(res.statistic), float(res.pvalue))
        stat.within_noise = bool(abs(stat.diff_mean) <= stat.diff_std)


def select_lr(runs: list[Run], metric: str, which: str) -> tuple[float | None, dict]:
    """The lr with the best mean selection metric, preferring lrs at which no run diverged or failed."""
    by_lr: dict = {}
    for r in runs:
        by_lr.setdefault(r.config.get(LR), []).append(r)
    sign = -1 if metric.rsplit("/", 1)[-1] in HIGHER_IS_BETTER else 1
    scores = {}
    for lr, rs in by_lr.items():
        vals = [v for r in rs if (v := r.value(metric, which)) is not None]
        scores[lr] = float(np.mean(vals)) if vals else math.nan
    clean = [lr for lr, rs in by_lr.items() if all(r.status == "completed" for r in rs)]
    pool = [lr for lr in (clean or by_lr) if math.isfinite(scores[lr])]
    return (min(pool, key=lambda lr: sign * scores[lr]) if pool else None), scores
