"""Statistics of one metric over seeds: bootstrap CI, paired comparison to a baseline, lr selection."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from attnlab.report.load import LR, Run, sort_key

HIGHER_IS_BETTER = ("accuracy", "accuracy_ts", "r2")  # metric name endings where larger wins
# The values a metric can take (by name ending); an interval is clipped to it (an ECE interval never
# goes below 0). Multiclass Brier is a sum of squares over classes: at most 2.
RANGES = {
    "accuracy": (0.0, 1.0),
    "ece": (0.0, 1.0),
    "brier": (0.0, 2.0),
    "r2": (-math.inf, 1.0),
    "perplexity": (1.0, math.inf),
    "loss": (0.0, math.inf),
    "nll": (0.0, math.inf),
    "mse": (0.0, math.inf),
    "bits_per_byte": (0.0, math.inf),
    "temperature": (0.0, math.inf),
}


def higher_is_better(metric: str) -> bool:
    """The name rule: whether the metric's name ending is one of HIGHER_IS_BETTER (direction: its attn_ statistics)."""
    return metric.rsplit("/", 1)[-1] in HIGHER_IS_BETTER


def statistic_of(metric: str) -> str | None:
    """The attention statistic a metric reports, its first path part starting with attn_ (test/attn_first_weight/
    layer_0/head_1, test_len/32/attn_entropy/layer_0, test/attn_sink_rate), else None."""
    return next((part for part in metric.split("/") if part.startswith("attn_")), None)


def direction(metric: str, runs: Iterable[Run] = ()) -> str | None:
    """Which values of `metric` are better: "higher", "lower", or None (neither: a statistic that describes).

    An attention statistic (statistic_of) has the direction its runs recorded in metrics.json (Run.directions, as
    attnlab.statistics declares it), when every run of `runs` recorded the same one; None otherwise,
    and for a run recorded before directions were (its attn_ metrics have none) or for no runs at all. Any other
    metric follows the name rule (higher_is_better)."""
    stat = statistic_of(metric)
    if stat is None:
        return "higher" if higher_is_better(metric) else "lower"
    found = {r.directions.get(stat) for r in runs}
    found = {d if d in ("higher", "lower") else None for d in found}
    return found.pop() if len(found) == 1 else None


def direction_text(direction: str | None) -> str:
    """ "higher is better", "lower is better", or "no better direction"."""
    return f"{direction} is better" if direction else "no better direction"


def metric_range(metric: str) -> tuple[float, float]:
    name = metric.rsplit("/", 1)[-1].removesuffix("_ts").removesuffix("_bigram")
    return RANGES.get(name, (-math.inf, math.inf))


def clip(interval: tuple[float, float], metric: str, diff: bool = False) -> tuple[float, float]:
    """An interval clipped to the metric's range (a difference to ±the range's width); NaN stays NaN."""
    lo, hi = metric_range(metric)
    if diff:
        lo, hi = -(hi - lo), hi - lo
    return tuple(x if math.isnan(x) else min(max(x, lo), hi) for x in interval)


# Below SMALL_N values a percentile bootstrap only reshuffles the few values it has (with two seeds its
# 95% interval is exactly the two values), so a cell gets the Student-t interval of the mean instead,
# marked "low n"; a single value gets no interval. Below MIN_PAIRS paired differences a t-test has at
# most one degree of freedom: the differences are reported, no p-value.
SMALL_N = 5
MIN_PAIRS = 3
CI_LEVEL = 0.95


def bootstrap_ci(x, n_boot: int = 2000, seed: int = 0, level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (Efron); NaN below two values."""
    x = np.asarray(x, np.float64)
    if len(x) < 2:
        return math.nan, math.nan
    means = x[np.random.default_rng(seed).integers(0, len(x), (n_boot, len(x)))].mean(axis=1)
    lo, hi = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def t_ci(x, level: float = CI_LEVEL) -> tuple[float, float]:
    """Student-t interval of the mean, mean ± t_{(1+level)/2, n-1}·s/√n; NaN below two values."""
    from scipy import stats

    x = np.asarray(x, np.float64)
    if len(x) < 2:
        return math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean() - half), float(x.mean() + half)


def _interval(x, n_boot: int, seed: int) -> tuple[float, float]:
    """The interval of the mean: bootstrap from SMALL_N values, Student-t below (NaN below two)."""
    return bootstrap_ci(x, n_boot, seed) if len(x) >= SMALL_N else t_ci(x)


@dataclass
class Stat:
    """One metric in one cell: seeds' mean ± std, a CI of the mean and the paired comparison to the baseline."""

    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    ci_method: str = "bootstrap"  # bootstrap (n >= SMALL_N) | t (2 <= n < SMALL_N) | none (n < 2)
    by_seed: dict = field(default_factory=dict)
    n_pairs: int = 0
    diffs: dict = field(default_factory=dict)  # seed → paired difference to the baseline
    diff_mean: float = math.nan
    diff_std: float = math.nan
    t: float = math.nan
    p: float = math.nan  # NaN below MIN_PAIRS pairs: no test
    within_noise: bool | None = None
    diff_ci: tuple[float, float] = (math.nan, math.nan)  # 95% interval of the mean paired difference

    @property
    def low_n(self) -> bool:
        return 0 < self.n < SMALL_N


def per_seed(runs: list[Run], metric: str, which: str) -> dict:
    """{seed: the metric's value} over the completed runs with a finite value, in seed order; runs sharing a seed
    averaged."""
    by_seed: dict = {}
    for r in runs:
        if (v := r.value(metric, which)) is not None:
            by_seed.setdefault(r.seed, []).append(v)
    return {s: float(np.mean(by_seed[s])) for s in sorted(by_seed, key=sort_key)}


def cell_stat(runs: list[Run], metric: str, which: str, n_boot: int, seed: int) -> Stat:
    """Mean, std and CI (bootstrap from SMALL_N values, t below) of a metric over a cell's completed runs."""
    x = np.array([v for r in runs if (v := r.value(metric, which)) is not None])
    method = "bootstrap" if len(x) >= SMALL_N else "t" if len(x) >= 2 else "none"
    lo, hi = clip(_interval(x, n_boot, seed), metric)
    return Stat(
        n=len(x),
        mean=float(x.mean()) if len(x) else math.nan,
        std=float(x.std(ddof=1)) if len(x) > 1 else math.nan,
        ci_low=lo,
        ci_high=hi,
        ci_method=method,
        by_seed=per_seed(runs, metric, which),
    )


def compare(stat: Stat, base: Stat, metric: str = "", n_boot: int = 2000, seed: int = 0, test: bool = True) -> None:
    """Paired differences of a cell to its baseline cell on the seeds both completed; a paired t-test
    (scipy.stats.ttest_rel) only from MIN_PAIRS pairs. `test=False`, for a cell identical to its baseline, gives
    p = 1 without a test: its float-rounding differences are no effect, which a t-test could call significant."""
    from scipy import stats

    seeds = sorted(set(stat.by_seed) & set(base.by_seed), key=sort_key)
    x = np.array([stat.by_seed[s] for s in seeds])
    y = np.array([base.by_seed[s] for s in seeds])
    stat.n_pairs = len(seeds)
    if not seeds:
        return
    d = x - y
    stat.diffs = dict(zip(seeds, map(float, d)))
    stat.diff_mean = float(d.mean())
    if len(seeds) > 1:
        stat.diff_std = float(d.std(ddof=1))
        stat.diff_ci = clip(_interval(d, n_boot, seed), metric, diff=True)  # the same rule as a cell's mean
    if len(seeds) >= MIN_PAIRS and not test:  # one computation: no difference to test
        stat.t, stat.p, stat.within_noise = 0.0, 1.0, True
    elif len(seeds) >= MIN_PAIRS and not d.any():  # identical pairs make ttest_rel 0/0: no difference is p = 1
        stat.t, stat.p, stat.within_noise = 0.0, 1.0, True
    elif len(seeds) >= MIN_PAIRS:
        res = stats.ttest_rel(x, y)
        stat.t, stat.p = float(res.statistic), float(res.pvalue)
        stat.within_noise = bool(abs(stat.diff_mean) <= stat.diff_std)


def select_lr(runs: list[Run], metric: str, which: str) -> tuple[float | None, dict]:
    """The lr with the best mean selection metric, preferring lrs at which no run diverged or failed; ValueError for
    a metric without a better direction (direction)."""
    done = [r for r in runs if r.status == "completed"]
    better = direction(metric, done)
    if better is None and done:  # without a completed run no rate has a score: nothing to choose
        raise ValueError(f"select_by metric {metric} has no better direction (it describes); select by a loss or score")
    by_lr: dict = {}
    for r in runs:
        by_lr.setdefault(r.config.get(LR), []).append(r)
    sign = -1 if better == "higher" else 1
    scores = {}
    for lr, rs in by_lr.items():
        vals = [v for r in rs if (v := r.value(metric, which)) is not None]
        scores[lr] = float(np.mean(vals)) if vals else math.nan
    clean = [lr for lr, rs in by_lr.items() if all(r.status == "completed" for r in rs)]
    pool = [lr for lr in (clean or by_lr) if math.isfinite(scores[lr])]
    return (min(pool, key=lambda lr: sign * scores[lr]) if pool else None), scores


# Equivalence and power of the paired comparison (verdict.py). A margin is what "no practical difference" means
# for a metric: the default is one unit in the last of the three significant figures the report prints for a
# typical value (accuracy 0.01 = one percentage point, 0.01 bits per byte, 0.01 nats of loss), absolute for
# metrics on a fixed scale; for the scale-free ones (MSE, perplexity, anything unlisted) 1% of the baseline
# cell's mean. `--margin METRIC=VALUE` overrides it.
ABSOLUTE_MARGINS = {
    "accuracy": 0.01,
    "ece": 0.01,
    "brier": 0.01,
    "r2": 0.01,
    "loss": 0.01,
    "nll": 0.01,
    "bits_per_byte": 0.01,
}
RELATIVE_MARGIN = 0.01  # of |baseline mean|, for a metric without an absolute default
POWER = 0.8  # the power at which the detectable effect and the seeds needed are stated
MAX_SEEDS = 1000  # seeds_needed searches no further


def default_margin(metric: str, base_mean: float) -> float:
    """The equivalence margin of `metric`: ABSOLUTE_MARGINS by name ending, else RELATIVE_MARGIN·|base_mean|."""
    name = metric.rsplit("/", 1)[-1].removesuffix("_ts").removesuffix("_bigram")
    if name in ABSOLUTE_MARGINS:
        return ABSOLUTE_MARGINS[name]
    return RELATIVE_MARGIN * abs(base_mean) if math.isfinite(base_mean) else math.nan


def tost_p(diffs, margin: float) -> float:
    """Two one-sided paired t-tests (Schuirmann 1987) of |mean difference| < margin: the larger of the p-values
    of H0 mean <= −margin and H0 mean >= +margin; equivalence at level α when it is <= α."""
    from scipy import stats

    d = np.asarray(diffs, np.float64)
    n = len(d)
    if n < 2 or not margin > 0:
        return math.nan
    se = d.std(ddof=1) / math.sqrt(n)
    if se == 0:
        return 0.0 if abs(d.mean()) < margin else 1.0
    p_above_lower = stats.t.sf((d.mean() + margin) / se, n - 1)
    p_below_upper = stats.t.cdf((d.mean() - margin) / se, n - 1)
    return float(max(p_above_lower, p_below_upper))


def paired_power(effect: float, sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test at level alpha to detect a true mean difference `effect` from n pairs
    whose differences have standard deviation sd: P(|T| > t_{1−α/2, n−1}) with T noncentral t, noncentrality
    effect·√n/sd."""
    from scipy import stats

    if n < 2 or not sd > 0:
        return math.nan
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    nc = abs(effect) * math.sqrt(n) / sd
    # the lower tail is negligible for nc > 0, and scipy's nct.cdf returns NaN there once nc is large
    lower = stats.nct.cdf(-crit, n - 1, nc)
    return float(stats.nct.sf(crit, n - 1, nc) + (lower if math.isfinite(lower) else 0.0))


def detectable_effect(sd: float, n: int, alpha: float, power: float = POWER) -> float:
    """The smallest |mean difference| the paired t-test at level alpha detects with `power` from n pairs."""
    from scipy import optimize

    if n < 2 or not sd > 0:
        return math.nan
    hi = sd
    while paired_power(hi, sd, n, alpha) < power:
        hi *= 2
    return float(optimize.brentq(lambda e: paired_power(e, sd, n, alpha) - power, 0.0, hi, xtol=1e-12 * hi))


def seeds_needed(effect: float, sd: float, alpha: float, power: float = POWER) -> int | None:
    """The fewest pairs with which the paired t-test at level alpha detects `effect` with `power`; None beyond
    MAX_SEEDS (or without an effect or a spread)."""
    if not abs(effect) > 0 or not sd > 0:
        return None
    return next((n for n in range(2, MAX_SEEDS + 1) if paired_power(effect, sd, n, alpha) >= power), None)
