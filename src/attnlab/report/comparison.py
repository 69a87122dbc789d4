"""The report's opening: which cells are compared, and per metric each cell against the baseline (Δ with
its interval, n and p), best first, beside the task's own baselines (chance, bigram, ...)."""

from __future__ import annotations

import math

import numpy as np

from attnlab.report import formation
from attnlab.report.cells import Cell, Table
from attnlab.report.load import LR
from attnlab.report.stats import MIN_PAIRS, direction_text
from attnlab.report.tables import num

TITLE_WIDTH = 100  # a title naming every cell up to this many characters; a longer one names the keys instead


def title(table: Table) -> str:
    """The report's first line: the cells compared where they fit in TITLE_WIDTH, else the keys varied and their
    number of values; against what, on which parameters."""
    if table.baseline:
        others = [c.label() for c in table.cells if not c.is_baseline]
        what = f"{', '.join(others) or 'no other cell'} against {table.baseline}"
    else:
        labels = [c.label() for c in table.cells]
        what = f"{', '.join(labels)} compared" if len(labels) > 1 else labels[0]
    if len(what) > TITLE_WIDTH:
        what = _axes(table) + (f"; baseline {table.baseline}" if table.baseline else "")
    return f"# {what} ({table.which} parameters)"


def _axes(table: Table) -> str:
    """`normalizer: 8 values, model.layers: 2 values` (and `optim.lr selected per cell` under --select-lr)."""
    counts = [(k, len({str(c.key[k]) for c in table.cells})) for k in table.group_by]
    axes = [f"{k}: {n} value{'s' * (n > 1)}" for k, n in counts] + [f"{LR} selected per cell"] * table.select_lr
    return ", ".join(axes) or "all runs"


def task_baselines(table: Table, metric: str) -> str:
    """`; chance 0.125` from the runs' metrics.json baselines: their mean where every cell has one and they agree
    (within 1%), else each cell's, named as its runs name it, beside the cell (cells whose tasks differ, e.g. lm's
    unigram rate of bytes and of a BPE's tokens)."""
    parts = []
    for key, label in table.judged_by.get(metric, {}).items():
        cells = [(c, values) for c in table.cells if (values := _values(c, key))]
        if not cells:
            continue
        everything = [v for _, values in cells for v in values]
        means = [float(np.mean(values)) for _, values in cells]
        if len(cells) == len(table.cells) and max(means) - min(means) <= 0.01 * abs(float(np.mean(everything))):
            parts.append(f"{label} {num(float(np.mean(everything)))}")
        else:
            parts += [f"{_label(c, metric, key, label)} {num(v)} ({c.label()})" for (c, _), v in zip(cells, means)]
    return "; task baselines: " + ", ".join(parts) if parts else ""


def _values(cell: Cell, key: str) -> list[float]:
    return [r.baseline[key] for r in cell.done() if isinstance(r.baseline.get(key), (int, float))]


def _label(cell: Cell, metric: str, key: str, default: str) -> str:
    """The name the cell's runs give baseline `key` of `metric` (a task may name it by its own units)."""
    return next(
        (r.baseline_labels[metric][key] for r in cell.done() if key in r.baseline_labels.get(metric, {})), default
    )


def _order(table: Table, metric: str) -> list[Cell]:
    """Best first: by the mean paired Δ when there is a baseline (the baseline itself at Δ = 0), else by mean; in
    the table's order when the metric is not ranked (Table.ranked); highest first for a metric without a better
    direction (Table.direction: a statistic that describes)."""
    better = table.direction(metric)
    if better is not None and not table.ranked(metric):
        return list(table.cells)
    sign = 1 if better == "lower" else -1

    def key(c: Cell):
        s = c.stats[metric]
        v = 0.0 if c.is_baseline else s.diff_mean if table.baseline and s.n_pairs else s.mean
        if table.baseline and not c.is_baseline and (not s.n_pairs or formation.withheld(table, c, metric)):
            v = math.nan  # not compared: ranked last
        return (math.isnan(v), sign * v if not math.isnan(v) else 0.0)

    return sorted(table.cells, key=key)


def _line(table: Table, c: Cell, metric: str) -> str:
    flag = c.standing()
    return _numbers(table, c, metric) + (f" — {flag}" if flag else "")


def _numbers(table: Table, c: Cell, metric: str) -> str:
    s = c.stats[metric]
    if s.n == 0:
        return f"{c.label()}: no completed run"
    value = formation.split(table, c, metric) or (
        num(s.mean) + (f" [{num(s.ci_low)}, {num(s.ci_high)}]" if s.n > 1 else "") + f" (n={s.n})"
    )
    if not table.baseline:
        return f"{c.label()}: {value}"
    if c.is_baseline:
        return f"{c.label()}: {value}, the baseline"
    if not s.n_pairs:
        return f"{c.label()}: {value}; Δ: no seed paired with the baseline"
    if c.identical:
        return f"{c.label()}: identical to the baseline (every seed, every metric); {value}"
    if why := formation.withheld(table, c, metric):
        return f"{c.label()}: not tested: {why}; {value}"
    delta = f"Δ {num(s.diff_mean, True)}"
    if s.n_pairs > 1:
        delta += f" [{num(s.diff_ci[0], True)}, {num(s.diff_ci[1], True)}]"
    delta += f", n={s.n_pairs} pair{'s' * (s.n_pairs > 1)}"
    delta += f", p={s.p:.3g}" if s.n_pairs >= MIN_PAIRS else f" (no test below {MIN_PAIRS} pairs)"
    return f"{c.label()}: {delta}; {value}"


def _unranked(table: Table, metric: str) -> str:
    """Why a metric is not ranked (Table.ranked)."""
    judged = table.judged_by
    if metric in judged:
        return "no cell beats the task's baseline on it"
    head = next(iter(judged))
    return f"no cell beats the task's baseline on {head} away from a plateau (none has learnt the task)"


def comparison(table: Table) -> list[str]:
    """The opening section, headline metric first (Table.judged_by), cells best first (highest first for a metric
    without a better direction, listed without ranks)."""
    order = [*table.judged_by, *(m for m in table.metrics if m not in table.judged_by)]
    intro = (
        f"Per metric, each cell's mean paired difference Δ to {table.baseline} over the seeds both completed, "
        f"its 95% interval, the number of pairs and the paired t-test p (from {MIN_PAIRS} pairs); then the "
        "cell's mean [95% interval] (n). Best first."
        if table.baseline
        else "Per metric, each cell's mean [95% interval] (n), best first; --baseline KEY=VALUE adds paired "
        "differences."
    )
    if any(table.direction(m) is None for m in order):
        intro += " A statistic with no better direction (it describes) lists the cells highest first, unranked."
    out = ["## Comparison", "", intro, ""]
    if table.baseline:
        out[0] = f"## Comparison against {table.baseline}"
    for m in order:
        better = table.direction(m)
        if better is None:
            out.append(f"- **{m}** ({direction_text(better)}; highest first{task_baselines(table, m)})")
            out += [f"  - {_line(table, c, m)}" for c in _order(table, m)]
        elif table.ranked(m):
            out.append(f"- **{m}** ({direction_text(better)}{task_baselines(table, m)})")
            out += [f"  {i}. {_line(table, c, m)}" for i, c in enumerate(_order(table, m), start=1)]
        else:
            out.append(
                f"- **{m}** ({direction_text(better)}{task_baselines(table, m)}); not ranked: {_unranked(table, m)}"
            )
            out += [f"  - {_line(table, c, m)}" for c in _order(table, m)]
    return out
