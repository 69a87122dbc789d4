"""Where the report says a sweep cannot rank its cells (plateaus) or ranks them at their budget (still-falling
losses), what it leaves unranked, and whether its runs ran the same code (provenance), on synthetic run
directories."""

from __future__ import annotations

import numpy as np
from run_records import write_run

from attnlab.report import load_runs, summarize
from attnlab.report.provenance import section
from attnlab.report.write import to_markdown
from attnlab.run.convergence import at_plateaus, still_falling

SEEDS = (0, 1, 2)
PLATEAU = {"test/accuracy": {"1/pairs": 0.25}}  # MQAR with 4 pairs (MQAR.plateaus)


def mqar_sweep(root, accuracy, falling=lambda norm, seed: False, rise=lambda norm, seed: 0.0):
    """softmax, sigmoid, linear × 3 seeds with the records a run writes: its plateau flags and convergence (`rise`:
    how far its last val loss lies above its least)."""
    i = 0
    for norm in ("softmax", "sigmoid", "linear"):
        for seed in SEEDS:
            acc = accuracy(norm, seed)
            final = {"val/loss": 3.0 - acc, "test/accuracy": acc, "test/loss": 3.0 - acc, "test/ece": 0.02 + acc / 10}
            conv = {"val_loss_falling": falling(norm, seed), "window": [200, 400], "evals": 3, "relative_drop": 0.05}
            conv.update(least=2.0, least_step=300, rise=rise(norm, seed))
            extra = {"plateaus": at_plateaus(final, PLATEAU), "convergence": conv}
            write_run(root, f"{i}_normalizer={norm},seed={seed}", norm, 0.003, seed, final, extra=extra)
            i += 1
    return root


def plateau_accuracy(norm, seed):
    return {"softmax": [0.29, 0.29, 0.51], "sigmoid": [0.26, 0.25, 0.27], "linear": [0.27, 0.28, 0.26]}[norm][seed]


def test_a_sweep_whose_cells_all_sit_at_the_plateau_cannot_rank_them(tmp_path):
    table = summarize(load_runs(mqar_sweep(tmp_path, plateau_accuracy)))
    md = to_markdown(table)
    verdict = md[md.index("## Verdict") : md.index("## Comparison")]
    # softmax: two of three seeds in the band [0.175, 0.325] around 1/4; its mean 0.363 alone is outside it
    assert (
        "**This sweep cannot rank these cells**: every compared cell sits at a plateau of its task, having learnt "
        "nothing it measures (normalizer=linear: at plateau test/accuracy ≈ 1/pairs 0.25 (3 of 3 runs); "
        "normalizer=sigmoid: at plateau test/accuracy ≈ 1/pairs 0.25 (3 of 3 runs); normalizer=softmax: at plateau "
        "test/accuracy ≈ 1/pairs 0.25 (2 of 3 runs))"
    ) in verdict
    assert "Which scale separates the normalizers on a CPU" in verdict
    comparison = md[md.index("## Comparison against normalizer=softmax") :]
    # accuracy beats chance (0.125) in every cell: ranked; ECE has no baseline, and no cell learnt the task
    assert "- **test/accuracy** (higher is better; task baselines: chance 0.125)\n  1. " in comparison
    assert (
        "- **test/ece** (lower is better); not ranked: no cell beats the task's baseline on test/accuracy away from "
        "a plateau (none has learnt the task)\n  - normalizer=linear: " in comparison
    )
    assert "normalizer=linear: Δ " in comparison and "— at plateau test/accuracy ≈ 1/pairs 0.25 (3 of 3 runs)" in md


def test_one_cell_off_the_plateau_lets_the_sweep_rank(tmp_path):
    solved = lambda norm, seed: 0.99 + 0.001 * seed if norm == "softmax" else plateau_accuracy(norm, seed)  # noqa: E731
    md = to_markdown(summarize(load_runs(mqar_sweep(tmp_path, solved))))
    assert "cannot rank" not in md
    assert "- **test/ece** (lower is better)\n  1. " in md  # ranked: softmax has learnt the task
    assert "normalizer=sigmoid (worse: Δ " in md  # and the verdict says what differs


def test_still_falling_cells_are_ranked_at_their_budget_not_refused(tmp_path):
    solved = lambda norm, seed: 0.9 + 0.01 * seed  # noqa: E731
    md = to_markdown(summarize(load_runs(mqar_sweep(tmp_path, solved, falling=lambda n, s: s > 0))))
    assert "cannot rank" not in md
    verdict = md[md.index("## Verdict") :].splitlines()
    assert verdict[2].startswith("**Ranked at the budget given**: every compared run trained 4 steps, and ")
    assert "and all 3 compared cells (val loss still falling (2 of 3 runs) in each) were still learning" in verdict[2]
    falling = lambda norm, seed: seed > 0 or norm == "softmax"  # noqa: E731
    md = to_markdown(summarize(load_runs(mqar_sweep(tmp_path / "a", solved, falling=falling))))
    opening = md[md.index("## Verdict") :].splitlines()[2]  # cells that differ: each named with its own standing
    assert "and normalizer=linear (val loss still falling (2 of 3 runs)); normalizer=sigmoid" in opening
    assert "normalizer=softmax (val loss still falling (3 of 3 runs)) were still learning" in opening
    md = to_markdown(summarize(load_runs(mqar_sweep(tmp_path / "b", solved, falling=lambda n, s: s > 1))))
    assert "cannot rank" not in md and "Ranked at the budget" not in md  # one of three runs still learning: settled


def test_a_cell_whose_val_loss_rose_after_its_least_says_in_how_many_runs(tmp_path):
    """A rise above 1% (convergence.FALLING_DROP) of the last val loss over the run's least: the final parameters are
    past the run's best on held-out data; 1% or less is not flagged."""
    solved = lambda norm, seed: 0.9 + 0.01 * seed  # noqa: E731
    rise = lambda norm, seed: {"sigmoid": [0.022, 0.05, 0.01]}.get(norm, [0.0] * 3)[seed]  # noqa: E731
    md = to_markdown(summarize(load_runs(mqar_sweep(tmp_path, solved, rise=rise))))
    text = " ".join(md.split())  # the Comparison's lines wrap
    assert (
        "normalizer=sigmoid: identical to the baseline (every seed, every metric); 0.91 [0.885, 0.935] (n=3) — "
        "val loss rose after its least (2 of 3 runs)" in text
    )
    assert text.count("— val loss rose after its least") == 3  # sigmoid's line under each metric, no other cell's


def test_cells_at_a_plateau_and_still_falling_cannot_be_ranked(tmp_path):
    md = to_markdown(summarize(load_runs(mqar_sweep(tmp_path, plateau_accuracy, falling=lambda n, s: True))))
    assert "**This sweep cannot rank these cells**" in md and "Ranked at the budget" not in md
    assert "normalizer=linear: at plateau test/accuracy ≈ 1/pairs 0.25 (3 of 3 runs); val loss still falling" in md


def test_the_still_falling_rule_on_hand_made_curves():
    # least squares through the evaluations at steps >= 200 of 400 (200, 300, 400): slope by hand
    curve = {100: 2.0, 200: 1.5, 300: 1.4, 400: 1.3}
    x, y = np.array([200, 300, 400.0]), np.array([1.5, 1.4, 1.3])
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    drop = -slope * 200 / y.mean()
    got = still_falling(curve, 400)
    assert got["val_loss_falling"] is True and got["window"] == [200, 400] and got["evals"] == 3
    assert abs(got["relative_drop"] - drop) < 1e-12
    flat = still_falling({100: 2.0, 200: 1.30, 300: 1.31, 400: 1.295}, 400)
    assert flat["val_loss_falling"] is False and abs(flat["relative_drop"]) < 0.01
    # too few evaluations to fit a line: unknown, never "converged"
    assert still_falling({200: 1.5, 400: 1.3}, 400)["val_loss_falling"] is None
    # fewer than 3 in the last half: the last 3 evaluations
    assert still_falling({50: 3.0, 100: 2.0, 150: 1.9, 400: 1.0}, 400)["window"] == [100, 400]


def test_plateau_band_is_a_tenth_of_the_way_to_the_best_value():
    [row] = at_plateaus({"test/accuracy": 0.324}, PLATEAU)["test/accuracy"]
    assert (row["low"], row["high"], row["at"]) == (0.25 - 0.075, 0.25 + 0.075, True)
    assert not at_plateaus({"test/accuracy": 0.33}, PLATEAU)["test/accuracy"][0]["at"]
    lm = at_plateaus({"test/bits_per_byte": 3.2}, {"test/bits_per_byte": {"unigram": 4.7, "bigram": 3.5}})
    assert [r["at"] for r in lm["test/bits_per_byte"]] == [False, True]  # bigram band: 3.5 ± 0.35


ENV = {
    "git": {"sha": "a" * 40, "dirty": False},
    "versions": {"jax": "0.10.2"},
    "backend": "cpu",
    "devices": ["CpuDevice(id=0)"],
}


def provenance_sweep(root, odd=None):
    for i, (norm, seed) in enumerate((n, s) for n in ("softmax", "linear") for s in (0, 1)):
        env = {**ENV, **(odd or {})} if (norm, seed) == ("linear", 1) else ENV
        final = {"val/loss": 1.0, "test/accuracy": 0.5 + 0.1 * seed, "test/loss": 1.0}
        write_run(root, f"{i}_normalizer={norm},seed={seed}", norm, 0.003, seed, final, env=env)
    return root


def test_provenance_in_one_line_when_every_run_agrees(tmp_path):
    lines = section(summarize(load_runs(provenance_sweep(tmp_path))))
    assert lines == [
        "Provenance: all 4 runs agree: commit aaaaaaaaaaaa, dirty false, jax 0.10.2, device cpu×1 (CpuDevice)."
    ]


def test_provenance_names_the_cell_and_run_that_differ(tmp_path):
    odd = {"git": {"sha": "b" * 40, "dirty": True}, "versions": {"jax": "0.11.2"}}
    table = summarize(load_runs(provenance_sweep(tmp_path, odd)))
    assert section(table) == [
        "Provenance: the runs differ in commit, dirty, jax; a difference between cells may be theirs:",
        "- commit: aaaaaaaaaaaa in 3 of 4 runs; differs in normalizer=linear "
        "(bbbbbbbbbbbb: 3_normalizer=linear,seed=1)",
        "- dirty: false in 3 of 4 runs; differs in normalizer=linear (true: 3_normalizer=linear,seed=1)",
        "- jax: 0.10.2 in 3 of 4 runs; differs in normalizer=linear (0.11.2: 3_normalizer=linear,seed=1)",
    ]
    md = to_markdown(table).splitlines()
    assert md.index(section(table)[0]) < md.index("## Verdict")


def test_provenance_names_a_whole_cell_once(tmp_path):
    for i, (norm, seed) in enumerate((n, s) for n in ("softmax", "linear") for s in (0, 1)):
        env = {**ENV, "devices": ["CudaDevice(id=0)"], "backend": "gpu"} if norm == "linear" else ENV
        final = {"val/loss": 1.0, "test/accuracy": 0.5 + 0.1 * seed, "test/loss": 1.0}
        write_run(tmp_path, f"{i}_normalizer={norm},seed={seed}", norm, 0.003, seed, final, env=env)
    lines = section(summarize(load_runs(tmp_path)))
    # two against two: the value first seen counts as the common one (Counter.most_common keeps insertion order)
    assert (
        lines[1]
        == "- device: gpu×1 (CudaDevice) in 2 of 4 runs; differs in normalizer=softmax (cpu×1 (CpuDevice): all 2 runs)"
    )


def lm_runs(normalizer, bits):
    """lm runs: bits per byte against the unigram (4.7) and bigram (3.5) rates, as metrics.json holds them."""
    from pathlib import Path

    from attnlab.report import Run

    return [
        Run(
            Path(f"{normalizer}{s}"),
            "completed",
            {"normalizer": normalizer, "seed": s, "task": "lm"},
            {"test/bits_per_byte": b, "test/ece": 0.01 * (s + 1)},
            baseline={"baseline/bits_per_byte": 4.7, "baseline/bits_per_byte_bigram": 3.5},
            headline="test/bits_per_byte",
            baseline_labels={
                "test/bits_per_byte": {"baseline/bits_per_byte": "unigram", "baseline/bits_per_byte_bigram": "bigram"}
            },
        )
        for s, b in enumerate(bits)
    ]


def test_a_metric_is_ranked_once_a_cell_beats_the_weakest_baseline():
    # between the unigram and the bigram rate: learnt something (the unigram statistics and more), so ranked
    between = summarize(lm_runs("softmax", [4.0, 4.1, 4.2]) + lm_runs("linear", [4.3, 4.45, 4.5]))
    assert between.ranked("test/bits_per_byte") and between.ranked("test/ece")
    # worse than both: nothing learnt, neither the headline nor ECE is ranked
    above = summarize(lm_runs("softmax", [4.8, 4.9, 5.0]) + lm_runs("linear", [5.1, 5.25, 5.3]))
    assert not above.ranked("test/bits_per_byte") and not above.ranked("test/ece")


def test_a_record_without_convergence_gets_it_from_its_events(tmp_path):
    from tensorboardX import SummaryWriter

    final = {"val/loss": 1.3, "test/accuracy": 0.5, "test/loss": 1.3}
    run = write_run(tmp_path, "0_normalizer=softmax,seed=0", "softmax", 0.003, 0, final)  # trainer.steps 4
    writer = SummaryWriter(logdir=str(run))
    for step, loss in {1: 2.0, 2: 1.8, 3: 1.6, 4: 1.5}.items():
        writer.add_scalar("val/loss", loss, step)
    writer.close()
    [loaded] = load_runs(tmp_path)
    # the last half of 4 steps: evaluations 2, 3, 4; the line's drop over steps 2..4 by hand
    x, y = np.array([2.0, 3.0, 4.0]), np.array([1.8, 1.6, 1.5])
    drop = -np.polyfit(x, y, 1)[0] * 2 / y.mean()
    assert loaded.convergence["window"] == [2, 4]
    assert abs(loaded.convergence["relative_drop"] - drop) < 1e-6 and loaded.convergence["val_loss_falling"]
