"""Each module owns one thing: run.files writes the run's files, sweep.definition alone reads multirun.yaml."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from attnlab.report.expected import expected_jobs
from attnlab.run import files as run_files
from attnlab.sweep import definition


def test_run_files_writes_diverged_json_from_the_records_diagnosis_and_keeps_it_out_of_metrics(tmp_path):
    diagnosis = {"first_nonfinite_step": 3, "last_logged": {"train/loss": 2.5}, "batch": {"inputs": [[1, 2]]}}
    records = [
        {"status": "diverged", "diverged": {"step": 3, "reason": "r"}, "diagnosis": diagnosis},
        {"status": "completed"},
    ]
    dirs = [tmp_path / "seed0", tmp_path / "seed1"]
    for d in dirs:
        d.mkdir()
    run_files.write_results([0, 1], dirs, records, tmp_path, {"seed": 0}, print_summaries=False)
    assert json.loads((dirs[0] / "diverged.json").read_text()) == diagnosis
    assert not (dirs[1] / "diverged.json").exists()
    assert "diagnosis" not in json.loads((dirs[0] / "metrics.json").read_text())


def test_multirun_yaml_is_read_in_one_place(monkeypatch, tmp_path):
    """Every reader of a sweep's definition goes through sweep.definition.multirun_config (none opens it itself)."""
    saved = OmegaConf.create(
        {
            "hydra": {
                "overrides": {"task": ["normalizer=softmax,kl", "seed=0"], "hydra": []},
                "sweeper": {"params": {"optim.lr": "0.1,0.2"}},
            },
            "trainer": {"vmap_seeds": 1},
        }
    )
    monkeypatch.setattr(definition, "multirun_config", lambda _dir: saved)
    nowhere = tmp_path / "no-such-sweep"  # no multirun.yaml on disk: only the patched reader knows the sweep
    assert definition.swept_keys(nowhere) == {"normalizer", "optim.lr"}
    assert definition.sweep_values(nowhere) == {"normalizer": ["softmax", "kl"], "optim.lr": ["0.1", "0.2"]}
    assert len(expected_jobs(nowhere)) == 4
    assert "normalizer=softmax,kl" in definition.resume_command(nowhere)
