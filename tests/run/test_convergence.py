"""A run that has not settled says so: the single run's summary and a sweep job's line, read from the records
attnlab.run.convergence writes."""

from __future__ import annotations

import json

from attnlab.run.convergence import SOLVED_GAP, at_plateaus
from attnlab.run.summary import opening_lines
from attnlab.sweep.summary import job_line

PLATEAU = {"test/accuracy": {"1/pairs": 0.25}}
FALLING = {"val_loss_falling": True, "window": [200, 400], "evals": 3, "relative_drop": 0.041, "rule": "..."}
FLAT = {**FALLING, "val_loss_falling": False, "relative_drop": 0.002}


def record(acc, convergence, run_dir):
    final = {"test/accuracy": acc}
    return {
        "status": "completed",
        "final": final,
        "headline": "test/accuracy",
        "baseline": {"baseline/accuracy": 0.0312},
        "baseline_labels": {"test/accuracy": {"baseline/accuracy": "chance"}},
        "plateaus": at_plateaus(final, PLATEAU),
        "convergence": convergence,
        "run_dir": str(run_dir),
        "steps": 400,
    }


def test_the_summary_warns_of_a_falling_loss_and_a_plateau(tmp_path):
    lines = opening_lines(record(0.27, FALLING, tmp_path))
    assert lines[1] == "headline: test/accuracy 0.27 (baselines: chance 0.0312)"
    assert lines[2] == (
        "warning: not converged (val loss fell 4.1% over steps 200–400); at plateau: test/accuracy ≈ 1/pairs 0.25"
    )
    assert not any(t.startswith("warning:") for t in opening_lines(record(0.99, FLAT, tmp_path)))


def test_a_job_line_counts_the_seeds_that_have_not_settled(tmp_path):
    job = tmp_path / "2_normalizer=linear"
    job.mkdir()
    (job / "seeds.json").write_text("{}")
    for seed, (acc, conv) in enumerate([(0.27, FALLING), (0.26, FLAT), (0.9, FALLING)]):
        (job / f"seed{seed}").mkdir()
        (job / f"seed{seed}" / "metrics.json").write_text(json.dumps(record(acc, conv, job / f"seed{seed}")))
    assert job_line(job, 12.0) == (
        "job 2_normalizer=linear: 3 completed  test/accuracy 0.4767 (mean of 3 seeds)  12.0s  "
        "warning: not converged (2 of 3 seeds); at plateau: test/accuracy ≈ 1/pairs 0.25 (2 of 3 seeds)"
    )


def test_a_solved_run_is_settled_while_its_loss_still_falls(tmp_path):
    """Test accuracy within SOLVED_GAP of 1: its falling cross-entropy is right answers growing surer, not learning."""
    assert not any(t.startswith("warning:") for t in opening_lines(record(1 - SOLVED_GAP, FALLING, tmp_path)))
    lines = opening_lines(record(1 - 2 * SOLVED_GAP, FALLING, tmp_path))
    assert lines[2] == "warning: not converged (val loss fell 4.1% over steps 200–400)"


def test_a_val_loss_that_rose_after_its_least_is_flagged_in_the_summary_and_per_job(tmp_path):
    """The pydoc screen's softmax at 3e-2: validation loss least at step 300 (4.455), 4.553 at the end: +2.2%. A rise
    within 1% (the rule's FALLING_DROP) is noise, not a flag."""
    from attnlab.run.convergence import still_falling

    rose = still_falling({100: 4.973, 200: 4.528, 300: 4.455, 350: 4.500, 400: 4.553}, 400)
    assert rose["least_step"] == 300 and abs(rose["rise"] - (4.553 - 4.455) / 4.455) < 1e-12
    lines = opening_lines(record(0.6, rose, tmp_path))
    assert lines[2] == "warning: val loss rose after its least (+2.2% since step 300)"
    flat = still_falling({100: 4.9, 200: 4.54, 300: 4.526, 400: 4.534}, 400)
    assert abs(flat["rise"] - 0.008 / 4.526) < 1e-12
    assert not any(t.startswith("warning:") for t in opening_lines(record(0.6, flat, tmp_path)))
    job = tmp_path / "0_normalizer=softmax"
    for seed, conv in enumerate([rose, {**rose, "rise": 0.05, "least_step": 350}, flat]):
        (job / f"seed{seed}").mkdir(parents=True)
        (job / f"seed{seed}" / "metrics.json").write_text(json.dumps(record(0.6, conv, job / f"seed{seed}")))
    (job / "seeds.json").write_text("{}")
    assert job_line(job, 1.0).endswith("warning: val loss rose after its least (2 of 3 seeds)")
