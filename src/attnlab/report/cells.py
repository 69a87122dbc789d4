"""Cells of a sweep: runs grouped by config keys, each metric summarized over seeds (see attnlab.report)."""

from __future__ import annotations

import fnmatch
import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any

from attnlab.report import stats
from attnlab.report.load import LR, Run, drifted_keys, same_value, sort_key, varying_keys
from attnlab.report.stats import Stat
from attnlab.run.chance import lower_threshold
from attnlab.run.convergence import rose_after_least, still_learning
from attnlab.run.record import STATUSES  # always counted; others (interrupted, incomplete) when present


@dataclass
class Cell:
    """One group of runs (one value per group key) and its statistics."""

    key: dict[str, Any]
    runs: list[Run]
    lr: float | None = None  # the selected learning rate under select_lr
    lr_scores: dict = field(default_factory=dict)  # lr → mean selection metric
    lr_grid: list[float] = field(default_factory=list)  # every rate the cell's runs were given, ascending
    stats: dict[str, Stat] = field(default_factory=dict)
    is_baseline: bool = False
    identical: bool = False  # to its baseline partner: the same seeds, every metric equal to float tolerance

    @property
    def lr_edge(self) -> str:
        """Under select_lr, where the selected rate sits in the cell's grid: `low` (its lowest rate), `high` (its
        highest), `only` (a grid of one rate), '' (interior: the grid brackets it). A rate at which every run
        diverged still bounds the grid: a selection below it is bracketed."""
        if self.lr is None or not self.lr_grid:
            return ""
        if len(self.lr_grid) == 1:
            return "only"
        return "low" if self.lr == self.lr_grid[0] else "high" if self.lr == self.lr_grid[-1] else ""

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.runs)

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.key.items()) or "all runs"

    def near_chance(self, metric: str) -> bool:
        """Whether the cell's mean is within binomial noise of the task's baseline (the threshold its runs
        recorded, attnlab.run.chance: it depends on the task's test split only, so it serves --which best too)."""
        limits = [r.chance[metric]["threshold"] for r in self.runs if r.status == "completed" and metric in r.chance]
        s = self.stats.get(metric)
        return bool(limits) and s is not None and s.n > 0 and s.mean <= max(limits)

    def done(self) -> list[Run]:
        return [r for r in self.runs if r.status == "completed"]

    def at_plateau(self) -> list[Run]:
        """Completed runs whose test metric sits at a plateau their task declared (attnlab.run.convergence)."""
        return [r for r in self.done() if any(p.get("at") for rows in r.plateaus.values() for p in rows)]

    def still_falling(self) -> list[Run]:
        """Completed runs still learning at the end: val loss falling, task not solved (convergence.still_learning)."""
        return [r for r in self.done() if still_learning(r.convergence, r.final)]

    def plateaued(self) -> bool:
        """Whether at least half the cell's completed runs sit at a plateau of their task: nothing learnt."""
        done = self.done()
        return bool(done) and 2 * len(self.at_plateau()) >= len(done)

    def unsettled(self) -> bool:
        """Whether at least half the cell's completed runs sit at a plateau or were still learning: its numbers say
        where training stopped, not what the configuration can do."""
        done = self.done()
        flagged = {id(r) for r in self.at_plateau() + self.still_falling()}
        return bool(done) and 2 * len(flagged) >= len(done)

    def standing(self) -> str:
        """`at plateau test/accuracy ≈ 1/pairs 0.25 (3 of 3 runs); val loss still falling (2 of 3 runs)`, `val loss
        rose after its least (1 of 3 runs)`, or ''."""
        done, parts = self.done(), []
        labels: dict[str, int] = {}
        for r in done:
            for metric, rows in r.plateaus.items():
                for p in rows:
                    if p.get("at"):
                        name = f"{metric} ≈ {p['label']} {p['value']:.3g}"
                        labels[name] = labels.get(name, 0) + 1
        parts += [f"at plateau {name} ({k} of {len(done)} runs)" for name, k in labels.items()]
        falling = self.still_falling()
        if falling:
            parts.append(f"val loss still falling ({len(falling)} of {len(done)} runs)")
        rose = [r for r in done if rose_after_least(r.convergence)]
        if rose:  # the final parameters are past the run's best on held-out data (convergence.least)
            parts.append(f"val loss rose after its least ({len(rose)} of {len(done)} runs)")
        return "; ".join(parts)

    def beats_baseline(self, metric: str, labels: dict[str, str]) -> bool:
        """Whether the cell's mean is better than the weakest task baseline of `metric` (of its runs' baseline values
        `labels` names: chance, the unigram rate, the zero predictor; a regression's reference estimator is a bar
        to reach, not the baseline of having learnt something); an accuracy with a chance flag must also be beyond
        binomial noise of it (near_chance). False for a metric without a better direction (stats.direction)."""
        s = self.stats.get(metric)
        if s is None or s.n == 0:
            return False
        if any(metric in r.chance for r in self.done()) and self.near_chance(metric):
            return False
        better = stats.direction(metric, self.done())
        if better is None:  # a statistic that describes beats nothing
            return False
        sign = 1 if better == "higher" else -1
        refs = [r.baseline[k] for r in self.done() for k in labels if isinstance(r.baseline.get(k), (int, float))]
        return any(sign * (s.mean - ref) > 0 for ref in refs)

    def below_chance(self, metric: str) -> bool:
        """Whether the cell's mean is below the 2.5% point of the baseline's binomial (attnlab.run.chance): worse than
        guessing. A record without that point (its flag's `lower`) gives it from its baseline and n."""
        flags = [r.chance[metric] for r in self.runs if r.status == "completed" and metric in r.chance]
        limits = [f["lower"] if "lower" in f else lower_threshold(f["baseline"], f["n"]) for f in flags]
        s = self.stats.get(metric)
        return bool(limits) and s is not None and s.n > 0 and s.mean < min(limits)


@dataclass
class Table:
    """The summary of a sweep; writers live in attnlab.report.tables and attnlab.report.plots."""

    group_by: list[str]
    metrics: list[str]
    which: str
    cells: list[Cell]
    baseline: str | None = None
    select_lr: bool = False
    select_by: str | None = None
    missing: list[dict] = field(default_factory=list)  # expected cells without any run
    short: list[tuple[dict, int, list]] = field(default_factory=list)  # (cell, completed seeds, missing seeds)
    max_seeds: int = 0
    notes: list[str] = field(default_factory=list)
    progress: str | None = None  # "N of M runs completed; missing: ..." against the sweep's definition
    missing_runs: list[str] = field(default_factory=list)  # jobs not started, runs without an outcome
    live: list[str] = field(default_factory=list)  # the Still running section (attnlab.report.running)
    alpha: float = 0.05  # the verdict's family-wise level (attnlab.report.verdict)
    baseline_given: bool = True  # False: `baseline` is DEFAULT_BASELINE, chosen because the sweep has it
    no_default_baseline: str = ""  # why DEFAULT_BASELINE, present in the sweep, was not taken (several cells)
    margins: dict[str, float] = field(default_factory=dict)  # fnmatch pattern -> equivalence margin (--margin)
    n_boot: int = 2000  # bootstrap resamples of every interval summarize computed (and the length table's)
    cache: dict = field(default_factory=dict, repr=False)  # run path -> its TensorBoard scalars, read once
    seed: int = 0  # the bootstrap's seed
    formed: list = field(default_factory=list)  # formation.Condition: what must have formed (--formed)
    formed_in: str = "baseline"  # whose seeds must all have formed it for a comparison to be tested (--formed-in)

    @property
    def judged_by(self) -> dict[str, dict[str, str]]:
        """{metric: {baseline key: label}} of the metrics the runs' tasks read against a baseline, headline metrics
        first (metrics.json's headline and baseline_labels), restricted to the table's metrics."""
        runs = [r for c in self.cells for r in c.runs]
        order = [r.headline for r in runs if r.headline] + [m for r in runs for m in r.baseline_labels]
        labels = {m: {k: v for r in runs for k, v in r.baseline_labels.get(m, {}).items()} for m in order}
        return {m: labels[m] for m in dict.fromkeys(order) if m in self.metrics}

    def direction(self, metric: str) -> str | None:
        """Which values of `metric` are better, as its completed runs recorded it: "higher", "lower", or None
        (neither: an attention statistic that describes; stats.direction)."""
        return stats.direction(metric, [r for c in self.cells for r in c.done()])

    def ranked(self, metric: str) -> bool:
        """Whether a ranking of the cells on `metric` means anything: some cell beats the task's weakest baseline on
        it (a metric with baselines: beats_baseline), or, for a metric without, some cell beats it on the headline
        metric and is not at a plateau. True when the runs declare no baselines; False for a metric without a better
        direction (Table.direction), whatever the baselines."""
        if self.direction(metric) is None:
            return False
        judged = self.judged_by
        if not judged:
            return True
        if metric in judged:
            return any(c.beats_baseline(metric, judged[metric]) for c in self.cells)
        head, labels = next(iter(judged.items()))
        return any(c.beats_baseline(head, labels) and 2 * len(c.at_plateau()) < len(c.done()) for c in self.cells)

    @property
    def statuses(self) -> list[str]:
        """completed, diverged, failed, then any other status present (interrupted, incomplete)."""
        seen = {r.status for c in self.cells for r in c.runs}
        return [*STATUSES, *sorted(seen - set(STATUSES))]

    def rows(self) -> list[dict[str, Any]]:
        """Tidy rows, one per cell and metric (the CSV), keys in column order."""
        out = []
        for c in self.cells:
            base = {**c.key, **(self._lr_columns(c) if self.select_lr else {})}
            for m in self.metrics:
                s = c.stats[m]
                out.append(
                    {
                        **base,
                        "metric": m,
                        "n": s.n,
                        "low_n": s.low_n,
                        "mean": s.mean,
                        "std": s.std,
                        "ci_low": s.ci_low,
                        "ci_high": s.ci_high,
                        "ci_method": s.ci_method,
                        **{st: c.count(st) for st in self.statuses},
                        "n_pairs": s.n_pairs,
                        "diff_mean": s.diff_mean,
                        "diff_std": s.diff_std,
                        "t": s.t,
                        "p": s.p,
                        "within_noise": s.within_noise,
                    }
                )
        return out

    @staticmethod
    def _lr_columns(c: Cell) -> dict[str, Any]:
        """The CSV's selected rate, where it sits in the cell's grid (Cell.lr_edge) and the grid itself (its rates
        separated by spaces: experiments/bracket_lrs.py extends it)."""
        return {LR: c.lr, "lr_at_edge": c.lr_edge, "lr_grid": " ".join(repr(float(x)) for x in c.lr_grid)}

    def completeness(self) -> list[str]:
        """Lines saying which expected cells are missing or have fewer completed seeds than the fullest."""
        keys = self.group_by  # the rates are no factor of the expected cells (_completeness)
        fmt = lambda c: ", ".join(f"{k}={c[k]}" for k in keys) or "all runs"  # noqa: E731
        lines = [f"Missing cell (no run): {fmt(c)}" for c in self.missing]
        lines += [
            f"Fewer seeds: {fmt(c)} has {n} completed of {self.max_seeds}"
            + (f" (missing seed {', '.join(map(str, s))})" if s else "")
            for c, n, s in self.short
        ]
        if lines or self.missing_runs:  # never "complete" while a job of the sweep has no outcome
            return lines
        return [f"Complete: every expected cell has {self.max_seeds} completed seed(s)."]


def default_metrics(runs: list[Run], which: str) -> list[str]:
    """Every test/ metric of the completed runs, minus the post-hoc temperature-scaling extras and the per-layer
    attention statistics (test/attn_*/layer_i: named with --metrics; the overall sink rate stays)."""
    done = [r.final if which == "final" else r.best for r in runs if r.status == "completed"]
    found = {k for rec in done for k in rec}
    # test/nll equal to test/loss in every run (softmax_ce, hlgauss: the loss is the NLL) is one metric, not two
    same = "test/nll" in found and all(rec.get("test/nll") == rec.get("test/loss") for rec in done)
    return sorted(
        k
        for k in found
        if k.startswith("test/")
        and not k.endswith("_ts")
        and k != "test/temperature"
        and not (k.startswith("test/attn_") and "/layer_" in k)
        and not (same and k == "test/nll")
    )


def summarize(
    runs: list[Run],
    group_by: list[str] | None = None,
    metrics: list[str] | None = None,
    which: str = "final",
    baseline: str | None = None,
    select_lr: bool = False,
    select_by: str = "val/loss",
    n_boot: int = 2000,
    seed: int = 0,
) -> Table:
    """Group runs into cells and summarize each metric over seeds (see the module docstring)."""
    if which not in ("final", "best"):
        raise ValueError(f"which={which!r}; allowed: final, best")
    group_by = _group_keys(runs, group_by, select_lr)
    metrics = _metrics(runs, metrics, which, select_lr, select_by)
    table = Table(
        group_by=group_by,
        metrics=metrics,
        which=which,
        cells=[],
        baseline=baseline,
        select_lr=select_lr,
        select_by=select_by if select_lr else None,
        n_boot=n_boot,
        seed=seed,
    )
    table.cells = _cells(runs, group_by, metrics, which, select_lr, select_by, n_boot, seed)
    if baseline is None and _has_default_baseline(table):
        try:  # the default is taken only where it is one cell per comparison, else the verdict says why not
            _check_baseline(table, DEFAULT_BASELINE)
            baseline, table.baseline, table.baseline_given = DEFAULT_BASELINE, DEFAULT_BASELINE, False
        except ValueError as exc:
            table.no_default_baseline = str(exc)
    if baseline:
        _apply_baseline(table, baseline, n_boot, seed)
    _completeness(table, runs)
    table.notes += _notes(table, runs)
    return table


def _has_default_baseline(table: Table) -> bool:
    """Whether the cells vary DEFAULT_BASELINE's key and one of several cells has its value."""
    key, _, value = DEFAULT_BASELINE.partition("=")
    return key in table.group_by and len(table.cells) > 1 and any(same_value(c.key[key], value) for c in table.cells)


def _group_keys(runs: list[Run], group_by: list[str] | None, select_lr: bool) -> list[str]:
    """The keys cells are grouped by (the varying keys by default; not the learning rate under select_lr)."""
    configured = [r for r in runs if r.config]
    known = set().union(*(r.config for r in configured)) if configured else set()
    group_by = varying_keys(runs) if group_by is None else list(group_by)
    unknown = [k for k in group_by if k not in known]
    if unknown and configured:
        raise ValueError(f"unknown group key(s) {', '.join(unknown)}; varying keys: {', '.join(varying_keys(runs))}")
    if select_lr:
        if len({r.config.get(LR) for r in configured}) < 2:
            raise ValueError(f"select_lr needs a sweep over {LR}; this one has a single learning rate")
        group_by = [k for k in group_by if k != LR]
    return group_by


def _metrics(runs: list[Run], metrics: list[str] | None, which: str, select_lr: bool, select_by: str) -> list[str]:
    """The metrics summarized: the defaults, or the given names and patterns matched against the completed runs'."""
    done = [r for r in runs if r.status == "completed"]
    found = sorted({k for r in done for k in (r.final if which == "final" else r.best)})
    metrics = default_metrics(runs, which) if metrics is None else expand(metrics, found) if done else list(metrics)
    if select_lr and done and select_by not in found:
        raise ValueError(
            f"select_by metric {select_by} in no completed run's {which} record; available: {', '.join(found)}"
        )
    return metrics


def _cells(runs, group_by, metrics, which, select_lr, select_by, n_boot, seed) -> list[Cell]:
    """One cell per value of the group keys, in sort order: its runs (those of the selected lr) and statistics."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(tuple(r.config.get(k) for k in group_by), []).append(r)
    cells = []
    for key in sorted(groups, key=lambda t: tuple(map(sort_key, t))):
        cell = Cell(key=dict(zip(group_by, key)), runs=groups[key])
        if select_lr:
            cell.lr, cell.lr_scores = stats.select_lr(cell.runs, select_by, which)
            cell.lr_grid = sorted(lr for lr in cell.lr_scores if isinstance(lr, (int, float)))
            cell.runs = [r for r in cell.runs if r.config.get(LR) == cell.lr] if cell.lr is not None else cell.runs
        cell.stats = {m: stats.cell_stat(cell.runs, m, which, n_boot, seed) for m in metrics}
        cells.append(cell)
    return cells


def _notes(table: Table, runs: list[Run]) -> list[str]:
    """What a reader of the table must know: cells at or below chance, config keys not grouped, runs without a
    config, seeds shared within a cell."""
    notes, metrics, configured = [], table.metrics, [r for r in runs if r.config]
    if any(c.below_chance(m) for c in table.cells for m in metrics):
        notes.append(
            "below chance: the cell's mean accuracy is below the 2.5% point of Binomial(n, baseline)/n "
            "over the n test targets: worse than guessing, not merely at chance (attnlab.run.chance)."
        )
    if any(c.near_chance(m) and not c.below_chance(m) for c in table.cells for m in metrics):
        notes.append(
            "≈chance: the cell's mean accuracy is within noise of the task's baseline (at or below the "
            "97.5% point of Binomial(n, baseline)/n over the n test targets; attnlab.run.chance)."
        )
    drift = [k for k in drifted_keys(runs) if k not in table.group_by]
    if drift and configured:
        notes.append(
            f"Config key(s) present in only some runs, not grouped: {', '.join(drift)} "
            "(the config changed during the sweep?)."
        )
    if len(configured) < len(runs):
        notes.append(f"{len(runs) - len(configured)} run(s) have no readable config; grouped under None.")
    done_seeds = [[r.seed for r in c.runs if r.status == "completed"] for c in table.cells]
    dupes = [c.label() for c, seeds in zip(table.cells, done_seeds) if len(set(seeds)) < len(seeds)]
    if dupes:
        notes.append(
            f"Several runs share a seed in: {'; '.join(dupes)} (a varying key may be missing from "
            "the grouping); their values are averaged per seed for pairing."
        )
    return notes


def expand(patterns: list[str], names: list[str], what: str = "metric") -> list[str]:
    """fnmatch patterns (a plain name matches itself) → the names they match, in pattern order, each once;
    ValueError naming the available names when a pattern matches none."""
    out: dict[str, None] = {}
    for pat in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hits:
            raise ValueError(f"{what} {pat!r} matches nothing; available: {', '.join(names) or '(none)'}")
        out.update(dict.fromkeys(hits))
    return list(out)


def baseline_pairs(spec: str) -> list[tuple[str, str]]:
    """--baseline KEY=VALUE[,KEY=VALUE...] as [(key, value text)]; ValueError for a malformed or repeated pair. A
    comma splits pairs only where a KEY= follows it, so a value may hold a comma."""
    pairs = []
    for text in re.split(r",(?=[^,=]+=)", spec):
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"baseline {spec!r}: {text!r} is not KEY=VALUE; allowed: KEY=VALUE or several separated by commas, "
                "e.g. normalizer=softmax,model.output_gate=none"
            )
        pairs.append((key.strip(), value))
    keys = [k for k, _ in pairs]
    if len(set(keys)) < len(keys):
        raise ValueError(f"baseline {spec!r} names a key twice; allowed: each key once")
    return pairs


def is_baseline(key: dict[str, Any], pairs: list[tuple[str, str]]) -> bool:
    """Whether a cell's key matches every KEY=VALUE pair of a baseline."""
    return all(same_value(key.get(k), v) for k, v in pairs)


def _check_baseline(table: Table, spec: str) -> None:
    """ValueError when `spec` names a key that is not a group key, matches no cell, or matches several cells of
    which one would be compared with no cell (softmax with and without an output gate, for normalizer=softmax):
    a baseline is one cell per comparison, named with the keys that tell its candidates apart."""
    pairs = baseline_pairs(spec)
    if any(k not in table.group_by for k, _ in pairs):
        raise ValueError(
            f"baseline {spec!r} must be KEY=VALUE (several separated by commas) with KEY one of the group keys: "
            f"{', '.join(table.group_by) or '(none)'}"
        )
    matched = [c for c in table.cells if is_baseline(c.key, pairs)]
    if not matched:
        values = "; ".join(
            f"{k} values: {', '.join(map(str, sorted({c.key[k] for c in table.cells}, key=sort_key)))}"
            for k, _ in pairs
        )
        raise ValueError(f"baseline {spec!r} matches no cell; {values}")
    used = {id(base) for _, base in partners(table, spec)}
    idle = [c for c in matched if id(c) not in used]
    if len(matched) > 1 and idle:
        named = {k for k, _ in pairs}
        apart = [k for k in table.group_by if k not in named and len({str(c.key[k]) for c in matched}) > 1]
        # the keys whose value in an idle baseline cell no other cell has: those are what the baseline must fix
        others = [c for c in table.cells if not is_baseline(c.key, pairs)]
        fixing = [k for k in apart if any(all(o.key[k] != c.key[k] for o in others) for c in idle)] or apart
        keep = next((c for c in matched if id(c) in used), matched[0])
        pick = ",".join([spec, *(f"{k}={keep.key[k]}" for k in fixing)])
        raise ValueError(
            f"baseline {spec!r} matches {len(matched)} cells ({_some(matched)}), and {_some(idle)} would be compared "
            f"with nothing; a baseline is one cell: add the key(s) that tell them apart, e.g. --baseline {pick}"
        )


def _some(cells: list[Cell], most: int = 3) -> str:
    """The cells' labels separated by ';', the first `most` of a longer list and how many more (a message stays a
    few lines)."""
    shown = "; ".join(c.label() for c in cells[:most])
    return shown if len(cells) <= most else f"{shown}; and {len(cells) - most} more"


def _apply_baseline(table: Table, spec: str, n_boot: int, seed: int) -> None:
    _check_baseline(table, spec)
    pairs = baseline_pairs(spec)
    for c in table.cells:
        c.is_baseline = is_baseline(c.key, pairs)
    for c, base in partners(table, spec):
        c.identical = identical(c, base, table.which)
        for m in table.metrics:
            stats.compare(c.stats[m], base.stats[m], m, n_boot, seed, test=not c.identical)


def partners(table: Table, spec: str) -> list[tuple[Cell, Cell]]:
    """(cell, its baseline cell) for each cell not the baseline `spec` (KEY=VALUE[,KEY=VALUE...]) that has one: the
    cell matching every pair whose other group keys equal the cell's."""
    pairs = baseline_pairs(spec)
    named = {k for k, _ in pairs}
    out = []
    for c in table.cells:
        if is_baseline(c.key, pairs):
            continue
        base = [
            b
            for b in table.cells
            if is_baseline(b.key, pairs) and all(b.key.get(k) == v for k, v in c.key.items() if k not in named)
        ]
        if base:
            out.append((c, base[0]))
    return out


DEFAULT_BASELINE = "normalizer=softmax"  # the baseline when none is given and the sweep has it

# Two cells are one computation when every metric of every seed agrees to float32 tolerance: kl with a uniform
# prior against softmax differs in the last bits only (measured on CPU: test/loss relative 1e-7, a test/ece_ts
# of 8.6e-4 by 1e-11), while any change of what is computed moves a trained metric far beyond these.
IDENTICAL_RTOL, IDENTICAL_ATOL = 1e-5, 1e-6


def identical(cell: Cell, base: Cell, which: str) -> bool:
    """Whether `cell` and `base` completed the same seeds and every metric of every seed agrees to float32
    tolerance (IDENTICAL_RTOL, IDENTICAL_ATOL)."""

    def records(c):
        return {r.seed: (r.final if which == "final" else r.best) for r in c.runs if r.status == "completed"}

    a, b = records(cell), records(base)
    if not a or a.keys() != b.keys():
        return False
    for s in a:
        keys = {k for k in {*a[s], *b[s]} if k != "step"}
        if not keys or not all(
            isinstance(a[s].get(k), (int, float))
            and isinstance(b[s].get(k), (int, float))
            and math.isclose(a[s][k], b[s][k], rel_tol=IDENTICAL_RTOL, abs_tol=IDENTICAL_ATOL)
            for k in keys
        ):
            return False
    return True


def _completeness(table: Table, runs: list[Run]) -> None:
    # The expected cells are the group keys' product. Under select_lr the rates are not a factor of it: a grid extended
    # beyond an edge (experiments/bracket_lrs.py) or the selected runs alone give each cell rates of its own.
    keys = table.group_by
    configured = [r for r in runs if r.config]  # runs without a config are only noted (see summarize)
    values = [sorted({r.config.get(k) for r in configured}, key=sort_key) for k in keys]
    present: dict[tuple, set] = {}
    for r in configured:
        seeds = present.setdefault(tuple(r.config.get(k) for k in keys), set())
        if r.status == "completed":
            seeds.add(r.seed)
    table.missing = [dict(zip(keys, t)) for t in itertools.product(*values) if t not in present]
    all_seeds = sorted(set().union(*present.values()), key=sort_key) if present else []
    table.max_seeds = max((len(s) for s in present.values()), default=0)
    table.short = [
        (dict(zip(keys, t)), len(s), [x for x in all_seeds if x not in s])
        for t, s in sorted(present.items(), key=lambda kv: tuple(map(sort_key, kv[0])))
        if len(s) < table.max_seeds
    ]
