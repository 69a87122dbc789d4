"""Whether a run had finished learning: its validation loss still falling at the end, its metric at a task's plateau.

Still falling (the rule, a judgement): the val evaluations of the last half of training (at least MIN_EVALS of them,
else the last MIN_EVALS of the run) are fitted with a least-squares line; the loss is still falling when that line
drops by more than FALLING_DROP (1%) of the window's mean val loss across the window. Half, not a last tenth: the
default cadence (trainer.eval_every = steps // 4) gives four evaluations, so a shorter window holds too few points
for a slope; 1%, because a smaller change moves no reported metric in its third significant figure. A line, not the
last two points, so that one noisy evaluation neither hides nor fakes a trend. A run that has solved its task (test
accuracy within SOLVED_GAP of 1) is settled although its val loss falls: a cross-entropy keeps falling as right answers
grow surer (0.002 to 0.001 nats is a 50% drop) while no reported metric moves.

Rose after its least: the last val loss lies more than FALLING_DROP above the least of the run's evaluations. A model
that fits its training data past what generalises (a small training set or text passed over many times) shows it as
its training loss keeps falling; so does a run that became unstable. Either way the final parameters are not the
run's best on held-out data, which the report's `--which best` reads.

Still moving (the same line, for a statistic the report is asked about, attnlab-report --formed): its curve's line
over the last quarter of training changes by more than FALLING_DROP of its mean, in either direction. A quarter, not
half: a statistic is logged at every logging step, not at four evaluations, and what matters is whether it had
settled by the end.

At a plateau: a task declares the values its metric sits at before the model has learnt the task (Task.plateaus:
MQAR's 1/pairs accuracy of a model that finds the context's values but not which one a query asks for; a language
model's unigram and bigram rates). A run is at a plateau when its test metric lies within PLATEAU_BAND (10%) of the
distance from the plateau to the metric's best value (accuracy 1, bits per byte 0): on the default MQAR (4 pairs)
accuracy in [0.175, 0.325].
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attnlab.run.events import read_scalars

MIN_EVALS = 3
FALLING_DROP = 0.01
PLATEAU_BAND = 0.1
MOVING_FROM = 0.75  # still_moving's window: the last quarter of training
SOLVED_GAP = 0.01  # one unit in the last figure the report prints for an accuracy, as its equivalence margin
# The best value of a metric, by name ending: the band around a plateau is a fraction of the distance to it.
BEST = {"accuracy": 1.0, "bits_per_byte": 0.0, "loss": 0.0, "nll": 0.0, "mse": 0.0, "perplexity": 1.0}
RULE = (
    f"least-squares line through the val losses of the last half of training (at least {MIN_EVALS} evaluations) "
    f"drops by more than {FALLING_DROP:.0%} of their mean"
)


def trend(curve: dict[int, float], total_steps: int, start: float = 0.5) -> dict:
    """{window, evals, relative_drop} of a curve {step: value}: its least-squares line over the evaluations from
    `start` of training on (at least MIN_EVALS, else the last MIN_EVALS), the line's drop across them relative to
    their mean; {evals} alone below MIN_EVALS finite evaluations."""
    points = sorted((s, v) for s, v in curve.items() if math.isfinite(v))
    if len(points) < MIN_EVALS:
        return {"evals": len(points)}
    late = [p for p in points if p[0] >= start * total_steps]
    window = late if len(late) >= MIN_EVALS else points[-MIN_EVALS:]
    steps, values = np.array(window, np.float64).T
    slope = np.polyfit(steps, values, 1)[0]
    drop = -slope * (steps[-1] - steps[0]) / max(abs(values.mean()), 1e-12)
    return {"window": [int(steps[0]), int(steps[-1])], "evals": len(window), "relative_drop": float(drop)}


def least(curve: dict[int, float]) -> dict:
    """{least, least_step, rise}: the curve's least value, its step and how far the last value lies above it relative
    to it; {} below MIN_EVALS finite evaluations."""
    points = sorted((s, v) for s, v in curve.items() if math.isfinite(v))
    if len(points) < MIN_EVALS:
        return {}
    step, value = min(points, key=lambda p: p[1])
    return {"least": value, "least_step": step, "rise": (points[-1][1] - value) / max(abs(value), 1e-12)}


def rose_after_least(convergence: dict) -> bool:
    """Whether a run's last val loss lies more than FALLING_DROP above its least (`least`'s rise)."""
    return convergence.get("rise", 0.0) > FALLING_DROP


def still_falling(curve: dict[int, float], total_steps: int) -> dict:
    """{val_loss_falling: True | False | None (fewer than MIN_EVALS evaluations), window, evals, relative_drop, rule,
    least, least_step, rise} for a run's val loss curve {step: loss}."""
    line = trend(curve, total_steps)
    falling = line["relative_drop"] > FALLING_DROP if "relative_drop" in line else None
    return {"val_loss_falling": falling, "rule": RULE, **line, **least(curve)}


def still_moving(curve: dict[int, float], total_steps: int) -> bool | None:
    """Whether a statistic's curve still moved over the last quarter of training (MOVING_FROM): the rule of
    still_falling in either direction; None below MIN_EVALS evaluations."""
    drop = trend(curve, total_steps, MOVING_FROM).get("relative_drop")
    return None if drop is None else abs(drop) > FALLING_DROP


def still_learning(convergence: dict, final: dict) -> bool:
    """Whether a run's val loss was still falling at the end (`still_falling`) and its task is not solved yet."""
    accuracy = final.get("test/accuracy")
    solved = isinstance(accuracy, (int, float)) and accuracy >= BEST["accuracy"] - SOLVED_GAP
    return bool(convergence.get("val_loss_falling")) and not solved


def band(metric: str, plateau: float) -> tuple[float, float]:
    """The values counted as at `plateau` for `metric` (test/<name>): PLATEAU_BAND of the distance to its best."""
    best = BEST.get(metric.rsplit("/", 1)[-1])
    half = PLATEAU_BAND * abs(best - plateau) if best is not None else PLATEAU_BAND * abs(plateau)
    return plateau - half, plateau + half


def at_plateaus(final: dict[str, float], plateaus: dict[str, dict[str, float]]) -> dict[str, list[dict]]:
    """{test metric: [{label, value, low, high, at}]} for each declared plateau of a metric the run has."""
    out = {}
    for metric, named in plateaus.items():
        value = final.get(metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        rows = []
        for label, level in named.items():
            lo, hi = band(metric, level)
            rows.append({"label": label, "value": level, "low": lo, "high": hi, "at": bool(lo <= value <= hi)})
        out[metric] = rows
    return out


def val_curve(run_dir: Path) -> dict[int, float]:
    """The run's val/loss scalars {step: value}, read from its TensorBoard events."""
    return read_scalars(Path(run_dir)).get("val/loss", {})


def describe(record: dict) -> str:
    """`not converged (val loss fell 4.1% over steps 200–400)`, `val loss rose after its least (+2.2% since step
    300)`, `at plateau test/accuracy 1/pairs 0.25`, or ''."""
    parts = []
    conv = record.get("convergence") or {}
    if still_learning(conv, record.get("final") or {}):
        lo, hi = conv["window"]
        parts.append(f"not converged (val loss fell {conv['relative_drop']:.1%} over steps {lo}–{hi})")
    if rose_after_least(conv):
        parts.append(f"val loss rose after its least (+{conv['rise']:.1%} since step {conv['least_step']})")
    for metric, rows in (record.get("plateaus") or {}).items():
        parts += [f"at plateau: {metric} ≈ {r['label']} {r['value']:.4g}" for r in rows if r.get("at")]
    return "; ".join(parts)
