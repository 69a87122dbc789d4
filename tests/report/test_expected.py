"""The report's first lines against the sweep's own definition (multirun.yaml), and what is not a run:
refused commands leave nothing behind, and the report skips directories that hold no run."""

from __future__ import annotations

import json

from cli_helpers import train_in_process
from omegaconf import OmegaConf
from run_records import write_run

from attnlab.report import cli as report_cli
from attnlab.report import load_runs


def sweep_yaml(root, task, params=None):
    OmegaConf.save(
        {
            "hydra": {"overrides": {"task": task, "hydra": ["hydra.mode=MULTIRUN"]}, "sweeper": {"params": params}},
            "trainer": {"vmap_seeds": 1},
        },
        root / "multirun.yaml",
    )


def test_interrupted_sweep_lists_what_is_missing_by_name_and_never_says_complete(tmp_path, capsys):
    """normalizer=softmax,kl × seed=0,1 is four jobs (Hydra's order: the last key varies fastest); two
    completed, one started and killed (run.json, no metrics.json), one never started."""
    sweep_yaml(tmp_path, ["normalizer=softmax,kl", "seed=0,1", "optim.lr=0.001"])
    final = {"test/accuracy": 0.5, "test/loss": 1.0, "val/loss": 1.0}
    write_run(tmp_path, "0_normalizer=softmax,seed=0", "softmax", 0.001, 0, final)
    write_run(tmp_path, "1_normalizer=softmax,seed=1", "softmax", 0.001, 1, final)
    killed = write_run(tmp_path, "2_normalizer=kl,seed=0", "kl", 0.001, 0, None)
    (killed / "metrics.json").unlink()
    assert report_cli.cli([str(tmp_path), "--curves"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# normalizer=kl against normalizer=softmax (final parameters)"  # the default baseline
    assert out[1:3] == [
        "",
        "2 of 4 runs completed; missing: 2_normalizer=kl,seed=0 (incomplete), 3_normalizer=kl,seed=1 (not started).",
    ]
    assert not any(line.startswith("Complete") for line in out)


def test_sweeper_params_and_vmapped_seeds_count_as_runs(tmp_path, capsys):
    """hydra.sweeper.params sweeps too (first, as BasicSweeper does); trainer.vmap_seeds=2 makes each job two runs."""
    sweep_yaml(tmp_path, ["trainer.vmap_seeds=2"], params={"normalizer": "softmax,kl"})
    job = tmp_path / "0_normalizer=softmax"
    for s in (0, 1):
        write_run(job, f"seed{s}", "softmax", 0.001, s, {"test/accuracy": 0.5})
    (job / "seeds.json").write_text(json.dumps({"seeds": {}}))
    assert report_cli.cli([str(tmp_path), "--curves"]) == 0
    assert "2 of 4 runs completed; missing: 1_normalizer=kl (not started)." in capsys.readouterr().out


def test_a_full_sweep_says_none_missing_and_counts_other_outcomes(tmp_path, capsys):
    sweep_yaml(tmp_path, ["seed=0,1,2"])
    write_run(tmp_path, "0_seed=0", "softmax", 0.001, 0, {"test/accuracy": 0.5})
    write_run(tmp_path, "1_seed=1", "softmax", 0.001, 1, {"test/accuracy": 0.5})
    write_run(tmp_path, "2_seed=2", "softmax", 0.001, 2, {"test/accuracy": 0.0}, status="diverged")
    assert report_cli.cli([str(tmp_path), "--curves"]) == 0
    assert "2 of 3 runs completed (1 diverged); none missing." in capsys.readouterr().out


def test_report_skips_directories_that_hold_no_run(tmp_path, capsys):
    """outputs/ with a real run, a bare .hydra/ (never started) and a command refused by an older attnlab."""
    write_run(tmp_path, "a_run", "softmax", 0.001, 0, {"test/accuracy": 0.5})
    (tmp_path / "b_bare" / ".hydra").mkdir(parents=True)
    refused = write_run(tmp_path, "c_refused", "softmax", 0.001, 0, None, status="failed", record="hydra")
    (refused / "metrics.json").write_text(json.dumps({"status": "failed", "error": "configuration: model.heads=3 ..."}))
    assert [r.path.name for r in load_runs(tmp_path)] == ["a_run"]
    assert report_cli.cli([str(tmp_path), "--curves"]) == 0
    assert "1 of 1 runs completed; none missing." in capsys.readouterr().out


def test_a_refused_command_leaves_no_directory(tmp_path):
    proc = train_in_process("model=tiny", "model.heads=3", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "model.heads=3" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no outputs/<ts>/, not even an empty outputs/


def test_a_refused_resume_keeps_the_directory_it_was_pointed_at(tmp_path):
    run_dir = tmp_path / "old_run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{}")
    proc = train_in_process("model=tiny", "trainer.resume=true", f"hydra.run.dir={run_dir}", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "trainer.resume=true" in proc.stderr
    assert (run_dir / "run.json").read_text() == "{}"
