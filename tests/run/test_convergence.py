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
