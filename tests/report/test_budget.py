"""Verdicts at equal budget: cells still learning when training stopped are ranked at the budget they were given, the
verdict's first sentence says which (steps, examples, tokens) and whether the ranking held over the last half of the
evaluations, naming the cells whose val curves cross there; on run directories with TensorBoard events."""

from __future__ import annotations

import json

from run_records import write_run
from tensorboardX import SummaryWriter

from attnlab.report import cli as report_cli
from attnlab.report import load_runs, summarize
from attnlab.report.budget import crossings
from attnlab.report.write import to_markdown

SEEDS = (0, 1, 2)
FINAL = {"linear": 0.70, "sigmoid": 0.80, "softmax": 0.85}  # test accuracy, far above MQAR's 1/pairs plateau
# val/accuracy at steps 1-4, seed 0 (seeds 1, 2 add 0.01 per seed); linear < sigmoid < softmax at every step
HELD = {"linear": [0.3, 0.5, 0.6, 0.7], "sigmoid": [0.35, 0.55, 0.7, 0.8], "softmax": [0.4, 0.6, 0.75, 0.85]}
# sigmoid overtakes softmax at the last evaluation, within the last half (steps 2, 3, 4 of 4)
LATE = {**HELD, "sigmoid": [0.35, 0.55, 0.7, 0.9]}
# sigmoid overtakes softmax at step 2... before the window: the same order across steps 2, 3, 4
EARLY = {**HELD, "sigmoid": [0.3, 0.65, 0.8, 0.9]}


def learning_sweep(root, curves, batch=8, train_tokens=None):
    """softmax, sigmoid, linear × 3 seeds, every run's val loss still falling, its val/accuracy curve logged;
    `train_tokens` the training text's length a language model's run.json records (a dict: one per normalizer)."""
    for i, (norm, seed) in enumerate((n, s) for n in ("softmax", "sigmoid", "linear") for s in SEEDS):
        acc = FINAL[norm] + 0.01 * seed * (1 + i // 3)  # a spread of its own per normalizer
        final = {"val/loss": 3.0 - acc, "test/accuracy": acc, "test/loss": 3.0 - acc}
        conv = {"val_loss_falling": True, "window": [2, 4], "evals": 3, "relative_drop": 0.2}
        plateau = [{"label": "1/pairs", "value": 0.25, "low": 0.175, "high": 0.325, "at": False}]
        extra = {"convergence": conv, "plateaus": {"test/accuracy": plateau}}
        path = write_run(root, f"{i}_normalizer={norm},seed={seed}", norm, 0.003, seed, final, extra=extra)
        rec = json.loads((path / "run.json").read_text())
        rec["config"]["trainer"]["batch_size"] = batch
        if train_tokens is not None:  # one length, or one per normalizer
            rec["corpus"] = {"train_tokens": train_tokens[norm] if isinstance(train_tokens, dict) else train_tokens}
        (path / "run.json").write_text(json.dumps(rec))
        writer = SummaryWriter(logdir=str(path))
        for step, value in enumerate(curves[norm], start=1):
            writer.add_scalar("val/accuracy", value + 0.01 * seed, step)
            writer.add_scalar("val/loss", 3.0 - value, step)
        writer.close()
    return root


OPENING = (
    "**Ranked at the budget given**: every compared run trained 4 steps of batch 8 (32 examples; × task.seq_len 16 "
    "= 512 tokens), and all 3 compared cells (val loss still falling (3 of 3 runs) in each) were still learning "
    "when training stopped; the ranking below is of these cells at this budget, not of what each configuration "
    "reaches with more. "
)


def verdict_opening(md: str) -> str:
    return md[md.index("## Verdict") :].splitlines()[2]


def test_cells_still_learning_are_ranked_at_their_budget_and_the_ranking_held(tmp_path):
    md = to_markdown(summarize(load_runs(learning_sweep(tmp_path, HELD))))
    assert "cannot rank" not in md
    assert verdict_opening(md) == OPENING + (
        "The ranking held over the last half of the evaluations (val/accuracy at steps 2, 3, 4): no two cells' mean "
        "curves cross (higher is better)."
    )
    assert "- **test/accuracy**: differ from normalizer=softmax beyond seed noise: " in md  # ranked and tested


def test_a_language_models_budget_says_how_often_it_passed_over_its_training_text(tmp_path):
    """4 steps × batch 8 × 16 tokens = 512 tokens: 2.56 passes over a text of 200 tokens, 0.512 over one of 1,000."""
    md = to_markdown(summarize(load_runs(learning_sweep(tmp_path / "small", HELD, train_tokens=200))))
    assert "(32 examples; × task.seq_len 16 = 512 tokens: 2.56 passes over its 200 training tokens)" in md
    md = to_markdown(summarize(load_runs(learning_sweep(tmp_path / "large", HELD, train_tokens=1000))))
    assert "= 512 tokens: 0.512 passes over its 1,000 training tokens)" in md


def test_the_same_steps_over_texts_of_different_lengths_are_one_budget(tmp_path):
    """A BOS per window or another tokenizer changes the text's length, not the budget: the steps are said once."""
    tokens = {"softmax": 200, "sigmoid": 200, "linear": 1000}
    md = to_markdown(summarize(load_runs(learning_sweep(tmp_path, HELD, train_tokens=tokens))))
    assert verdict_opening(md).startswith(
        "**Ranked at the budget given**: every compared run trained 4 steps of batch 8 (32 examples; × task.seq_len 16 "
        "= 512 tokens), over a training text of its own (normalizer=linear: 0.512 passes over its 1,000 training "
        "tokens; normalizer=sigmoid: 2.56 passes over its 200 training tokens; normalizer=softmax: 2.56 passes over "
        "its 200 training tokens), and all 3 compared cells"
    )


def test_a_late_crossing_is_named(tmp_path, capsys):
    learning_sweep(tmp_path, LATE)
    assert report_cli.cli([str(tmp_path), "--curves", "val/accuracy"]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert verdict_opening(md) == OPENING + (
        "The ranking did not hold over the last half of the evaluations (val/accuracy at steps 2, 3, 4): these "
        "cells' mean curves cross there, and more steps may reorder them again: normalizer=sigmoid and "
        "normalizer=softmax (order last changed at step 4)."
    )


def test_a_crossing_before_the_last_half_is_not_named(tmp_path):
    table = summarize(load_runs(learning_sweep(tmp_path, EARLY)))
    steps, crossed = crossings(table, table.cells, "val/accuracy")
    assert steps == [2, 3, 4] and crossed == []
    assert "The ranking held over the last half of the evaluations" in verdict_opening(to_markdown(table))
    assert HELD["softmax"][0] > EARLY["sigmoid"][0] and EARLY["sigmoid"][1] > HELD["softmax"][1]  # at step 1 to 2


def test_without_a_batch_size_or_events_the_verdict_says_what_it_knows(tmp_path):
    learning_sweep(tmp_path, HELD, batch=None)
    for events in tmp_path.rglob("events.out.tfevents.*"):
        events.unlink()
    opening = verdict_opening(to_markdown(summarize(load_runs(tmp_path))))
    assert opening.startswith("**Ranked at the budget given**: every compared run trained 4 steps, and ")
    assert opening.endswith(
        "Whether the ranking held over the last half of the evaluations is not known: no compared run logged a val "
        "curve in its TensorBoard events."
    )
