"""The verdict at equal budget: cells still learning when training stopped are ranked at the budget they were given,
and the verdict says which budget (steps, examples, tokens) and whether the ranking held over the last half of the
evaluations (the cells' mean val curves, read from their TensorBoard events, crossing or not).

The convention of every language-modelling comparison: models are compared at an equal training budget while their
loss still falls. A ranking at a budget is a statement about that budget, so the verdict names it in its first
sentence, and names the cells whose curves cross late, whose order the next steps could change again. Cells at a
plateau of their task (nothing learnt) are another matter: verdict.cannot_rank.
"""

from __future__ import annotations

import math

import numpy as np

from attnlab.report import plots
from attnlab.report.cells import Cell, Table
from attnlab.report.load import Run
from attnlab.report.stats import direction_text

STEPS, BATCH, SEQ_LEN = "trainer.steps", "trainer.batch_size", "task.seq_len"


def learning(c: Cell) -> bool:
    """Whether at least half the cell's completed runs were still learning at the end (Cell.still_falling)."""
    done = c.done()
    return bool(done) and 2 * len(c.still_falling()) >= len(done)


def _count(n: int) -> str:
    return f"{n:,}"


def _passes(run: Run, tokens: int) -> str:
    """`: 16.5 passes over its 99,161 training tokens` for a run that records its training text's length, else ''."""
    if not isinstance(run.train_tokens, int) or run.train_tokens <= 0:
        return ""
    return f": {tokens / run.train_tokens:.3g} passes over its {_count(run.train_tokens)} training tokens"


def _positive(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _run_budget(r: Run, passes: bool) -> str:
    """One run's budget as budget_of words it, as far as its config tells."""
    steps, batch, seq = (r.config.get(k) for k in (STEPS, BATCH, SEQ_LEN))
    if not _positive(steps):
        return "an unrecorded number of steps"
    if not _positive(batch):
        return f"{_count(steps)} steps"
    text = f"{_count(steps)} steps of batch {batch} ({_count(steps * batch)} examples"
    if not _positive(seq):
        return text + ")"
    tokens = steps * batch * seq
    return f"{text}; × {SEQ_LEN} {seq} = {_count(tokens)} tokens{_passes(r, tokens) if passes else ''})"


def budget_of(c: Cell, passes: bool = True) -> str:
    """`400 steps of batch 64 (25,600 examples; × task.seq_len 64 = 1,638,400 tokens)`, as far as the runs' configs
    tell (steps alone without a batch size; no tokens without task.seq_len), and for a language model, unless
    `passes` is False, the passes over its training text that makes (`: 16.5 passes over its 99,161 training
    tokens`); runs of a cell that differ: each."""
    return " or ".join(dict.fromkeys(_run_budget(r, passes) for r in c.done())) or "no completed run"


def passes_of(c: Cell) -> str:
    """`4.53 passes over its 361,834 training tokens` of the cell's runs (each where they differ), '' for none."""
    found = []
    for r in c.done():
        steps, batch, seq = (r.config.get(k) for k in (STEPS, BATCH, SEQ_LEN))
        if all(map(_positive, (steps, batch, seq))) and (over := _passes(r, steps * batch * seq)):
            found.append(over.removeprefix(": "))
    return " or ".join(dict.fromkeys(found))


def curve_tag(table: Table, metric: str, runs: list[Run], fallback: tuple[str, ...] = ("val/loss",)) -> str | None:
    """The curve standing for `metric` that one of `runs` logged: test/X → val/X, else X as the training steps log it
    (an attention statistic, attn_first_weight/layer_0), else the first of `fallback`, else None."""
    tags = set(plots.scalar_tags(runs, table.cache))
    for tag in (metric.replace("test/", "val/", 1), metric.removeprefix("test/"), *fallback):
        if tag in tags:
            return tag
    return None


def crossings(table: Table, cells: list[Cell], tag: str) -> tuple[list[int], list[tuple[Cell, Cell, int]]]:
    """(the evaluation steps of the last half of training, [(a, b, step) for each pair of cells whose mean curves
    of `tag` swap order in them, `step` the last evaluation at which their order changed]). The last half: steps at
    or past half the longest run's trainer.steps (attnlab.run.convergence's window), at least the last 2 of each
    pair's common evaluations."""
    total = max(
        (r.config.get(STEPS) for c in cells for r in c.done() if isinstance(r.config.get(STEPS), int)), default=0
    )
    means = {}
    for c in cells:
        steps, mean, _, _ = plots.curve(c.done(), tag, table.cache)
        means[id(c)] = {int(s): float(m) for s, m in zip(steps, mean) if math.isfinite(m)}
    window: set[int] = set()
    out = []
    for i, a in enumerate(cells):
        for b in cells[i + 1 :]:
            common = sorted(set(means[id(a)]) & set(means[id(b)]))
            late = [s for s in common if s >= total / 2]
            late = late if len(late) >= 2 else common[-2:]
            window.update(late)
            signs = [(s, np.sign(means[id(a)][s] - means[id(b)][s])) for s in late]
            signs = [(s, g) for s, g in signs if g != 0]  # a tie is neither order
            flips = [s for (_, g0), (s, g1) in zip(signs, signs[1:]) if g0 != g1]
            if flips:
                out.append((a, b, flips[-1]))
    return sorted(window), out


def at_budget(table: Table, compared: list[Cell], metric: str) -> list[str]:
    """The verdict's opening when a compared cell was still learning (learning): the budget, the cells still
    learning, and whether the ranking on `metric`'s val curve held over the last half of the evaluations; [] when
    every compared cell had settled."""
    still = [c for c in compared if learning(c)]
    if not still:
        return []
    budgets = {c.label(): budget_of(c) for c in compared}
    without_passes = {budget_of(c, passes=False) for c in compared}
    if len(set(budgets.values())) == 1:
        budget = f"every compared run trained {next(iter(budgets.values()))}"
    elif len(without_passes) == 1:  # the same steps over texts of different lengths (a BOS per window, a tokenizer)
        over = "; ".join(f"{c.label()}: {passes_of(c)}" for c in compared)
        budget = f"every compared run trained {without_passes.pop()}, over a training text of its own ({over})"
    else:
        budget = "the compared runs trained different budgets (" + "; ".join(f"{k}: {v}" for k, v in budgets.items())
        budget += ")"
    standings = {c.standing() for c in still}
    if len(still) == len(compared) > 2 and len(standings) == 1:  # every cell alike: said once, not once per cell
        named = f"all {len(still)} compared cells ({standings.pop()} in each)"
    else:
        named = "; ".join(f"{c.label()} ({c.standing()})" for c in still)
    text = (
        f"**Ranked at the budget given**: {budget}, and {named} {'was' if len(still) == 1 else 'were'} still "
        "learning when training stopped; the ranking below is of these cells at this budget, not of what each "
        "configuration reaches with more."
    )
    return [text + " " + _held(table, compared, metric), ""]


def _held(table: Table, compared: list[Cell], metric: str) -> str:
    """Whether the order of the compared cells' mean val curves held over the last half of the evaluations."""
    if len(compared) < 2:
        return ""
    tag = curve_tag(table, metric, [r for c in compared for r in c.done()])
    if tag is None:
        return (
            "Whether the ranking held over the last half of the evaluations is not known: no compared run logged a "
            "val curve in its TensorBoard events."
        )
    steps, crossed = crossings(table, compared, tag)
    if len(steps) < 2:
        return f"Whether the ranking held over the last half of the evaluations is not known: {tag} has fewer than 2."
    where = f"{tag} at steps {', '.join(map(str, steps))}"
    if not crossed:
        return (
            f"The ranking held over the last half of the evaluations ({where}): no two cells' mean curves cross "
            f"({direction_text(table.direction(tag))})."
        )
    pairs = "; ".join(f"{a.label()} and {b.label()} (order last changed at step {s})" for a, b, s in crossed)
    return (
        f"The ranking did not hold over the last half of the evaluations ({where}): these cells' mean curves cross "
        f"there, and more steps may reorder them again: {pairs}."
    )
