"""Hydra multirun sweeps: launchers, the end-of-sweep summary, failure isolation and resume."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from cli_helpers import TINY, metrics, run_cli, tiny_task, train_in_process

from attnlab import exits

SWEEP = ["-m", "normalizer=softmax,linear", "seed=0,1", *TINY, *tiny_task("mqar")]
# Job directories name the swept values only (sweep.naming.job_name), in command-line order.
JOBS = [
    "0_normalizer=softmax,seed=0",
    "1_normalizer=softmax,seed=1",
    "2_normalizer=linear,seed=0",
    "3_normalizer=linear,seed=1",
]


def test_failed_job_is_isolated_reported_and_rerun_on_resume(tmp_path):
    blocker = tmp_path / JOBS[2] / "checkpoints"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a directory")  # makes job 2 raise inside training
    proc = train_in_process(*SWEEP, f"hydra.sweep.dir={tmp_path}", cwd=tmp_path, check=False)
    assert proc.returncode == exits.FAILED
    assert "3 completed" in proc.stderr and "1 failed" in proc.stderr and JOBS[2] in proc.stderr
    failed = metrics(tmp_path / JOBS[2])
    assert failed["status"] == "failed" and failed["error"]
    assert re.search(
        rf"^job {re.escape(JOBS[2])}: failed  {re.escape(failed['error'][:60])}.*  \d+\.\ds$", proc.stderr, re.M
    )
    assert f"  attnlab-report {tmp_path}" in proc.stderr.rstrip().splitlines()[-5:]  # next steps even on failure
    assert (tmp_path / JOBS[2] / "error.txt").exists()
    done = {job: (tmp_path / job / "metrics.json").stat().st_mtime_ns for job in JOBS if job != JOBS[2]}

    blocker.unlink()
    proc = train_in_process(*SWEEP, f"hydra.sweep.dir={tmp_path}", cwd=tmp_path)
    assert "4 completed" in proc.stderr
    assert proc.stderr.count("already completed with the same config; skipped") == 3
    assert metrics(tmp_path / JOBS[2])["status"] == "completed"
    for job, mtime in done.items():  # completed runs were not run again
        assert (tmp_path / job / "metrics.json").stat().st_mtime_ns == mtime
    # Distinct seeds give distinct runs; the same seed under another normalizer starts from the same data.
    assert metrics(tmp_path / JOBS[0])["final"] != metrics(tmp_path / JOBS[1])["final"]


def test_changed_config_is_not_skipped(tmp_path):
    train_in_process("-m", "normalizer=softmax", *TINY, *tiny_task("mqar"), f"hydra.sweep.dir={tmp_path}", cwd=tmp_path)
    job = tmp_path / "0"  # nothing swept: the job number alone
    shutil.rmtree(job / "checkpoints")
    proc = train_in_process(
        "-m",
        "normalizer=softmax",
        *TINY,
        *tiny_task("mqar"),
        "optim.lr=1e-2",
        f"hydra.sweep.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert "skipped" not in proc.stderr
    assert metrics(job)["status"] == "completed"


# Every launcher: in-process (basic), 2 joblib worker processes, submitit's local executor (the SLURM code path:
# pickled jobs run by other processes). None pins hydra.sweep.dir: each must resolve the default one once.
LAUNCHERS = {
    "basic": [],
    "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    "submitit": ["hydra/launcher=submitit_local"],
}


# Every launcher under `long` (~40 s each: a sweep, its report, an interrupt and two resumes); the default suite's
# sweeps run on Hydra's own launcher (test_failed_job_is_isolated_reported_and_rerun_on_resume, test_exit_codes).
@pytest.mark.long
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_one_sweep_directory_whatever_the_launcher_then_report_resume_and_nothing_left_to_do(tmp_path, launcher):
    """The jobs land in the one directory the sweep prints, named by the swept key only; the printed report
    command reads them; the resume command skips the completed job and resumes the other from its checkpoint;
    once report/ is written, the same command finds nothing left to do and exits 0."""
    from attnlab.sweep.definition import resume_command

    proc = run_cli("-m", *LAUNCHERS[launcher], "normalizer=softmax,linear", *TINY, *tiny_task("mqar"), cwd=tmp_path)
    [sweep] = (tmp_path / "multirun").iterdir()
    printed = re.search(r"^  attnlab-report (.+)$", proc.stderr, re.M).group(1)
    assert (tmp_path / printed).resolve() == sweep.resolve()
    jobs = ["0_normalizer=softmax", "1_normalizer=linear"]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")) == jobs
    assert [metrics(sweep / job)["steps"] for job in jobs] == [4, 4]
    if launcher != "submitit":  # (submitit's jobs print their lines to .submitit/<job>/*.err)
        for job in jobs:  # printed by the process that ran the job, its headline metric read back from its record
            acc = metrics(sweep / job)["final"]["test/accuracy"]
            line = rf"^job {re.escape(job)}: completed  test/accuracy {acc:.4f}  \d+\.\ds$"
            assert re.search(line, proc.stderr, re.M)
        assert [p for p in sweep.rglob("*") if p.is_file() and p.stat().st_size == 0] == []  # no empty cli.log
    assert proc.stderr.rstrip().splitlines()[-5:] == [
        "next:",
        f"  attnlab-report {printed}",
        f"  tensorboard --logdir {printed} --host 127.0.0.1",
        # runColorGroup=regex:[_,]normalizer=([^,/]+), URL-encoded: one colour per normalizer, whatever the seed
        "  then open http://127.0.0.1:6006/?smoothing=0&runColorGroup=regex:%5B_%2C%5Dnormalizer%3D(%5B%5E%2C%2F%5D%2B)"
        "#timeseries",
        "  Custom Scalars, unsmoothed: http://127.0.0.1:6006/#custom_scalars&_smoothingWeight=0",
    ]
    report = subprocess.run(
        [sys.executable, "-m", "attnlab.report.cli", printed], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert report.returncode == 0 and "2 of 2 runs completed; none missing" in report.stdout, report.stderr[-2000:]
    assert (sweep / "report" / "report.md").exists()

    kept = (sweep / jobs[0] / "metrics.json").stat().st_mtime_ns
    (sweep / jobs[1] / "metrics.json").unlink()  # job 1 lost its outcome; its checkpoint of step 4 remains
    resume = shlex.split(resume_command(sweep, "__main__.py"))[3:]  # what an interrupted sweep prints
    run_cli(*resume, cwd=tmp_path)
    assert (sweep / jobs[0] / "metrics.json").stat().st_mtime_ns == kept  # skipped, not run again
    resumed = metrics(sweep / jobs[1])
    assert resumed["status"] == "completed" and resumed["resumed_from"] == 4

    again = run_cli(*resume, cwd=tmp_path)  # report/ beside the jobs is no job
    assert re.search(rf"^sweep {re.escape(str(sweep))}: nothing left to do, .*\(2 completed\)$", again.stderr, re.M)
    assert "unfinished" not in again.stderr and "report" not in again.stderr.replace("attnlab-report", "")


@pytest.mark.parametrize("devices", [1, pytest.param(3, marks=pytest.mark.long)])  # 3: a process of 3 CPU devices
def test_vmapped_seeds_equal_separate_runs(tmp_path, devices):
    """trainer.vmap_seeds=3 writes 3 ordinary runs, each equal (float tolerance) to that seed run alone;
    on 3 devices each device trains one seed."""
    common = [*TINY, *tiny_task("mqar"), "trainer.steps=6", "trainer.log_every=2", "trainer.eval_every=6"]
    run_cli(
        *common,
        "trainer.vmap_seeds=3",
        "accelerator=cpu",
        f"accelerator.devices={devices}",
        f"hydra.run.dir={tmp_path / 'v'}",
        cwd=tmp_path,
    )
    train_in_process(*common, "seed=2", f"hydra.run.dir={tmp_path / 'alone'}", cwd=tmp_path)
    from attnlab.report import load_runs

    runs = load_runs(tmp_path / "v")
    assert [r.seed for r in runs] == [0, 1, 2] and all(r.status == "completed" for r in runs)
    vm, alone = metrics(tmp_path / "v" / "seed2"), metrics(tmp_path / "alone")
    assert vm["seeds_over_devices"] == (devices == 3)
    for key, value in alone["final"].items():
        assert vm["final"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    from cli_helpers import scalar_curve

    a = [v for _, v in scalar_curve(tmp_path / "v" / "seed2", "train/loss")]
    b = [v for _, v in scalar_curve(tmp_path / "alone", "train/loss")]
    assert a == pytest.approx(b, rel=1e-5)
    assert metrics(tmp_path / "v" / "seed0")["final"] != vm["final"]  # seeds differ


def test_job_names_hold_the_swept_values_only(tmp_path):
    from omegaconf import OmegaConf

    from attnlab.sweep.naming import MAX_NAME, job_name

    OmegaConf.save(
        {
            "hydra": {
                "overrides": {"task": ["normalizer=softmax,kl", "task.num_kv_pairs=2,4", "seed=0", "trainer.steps=9"]},
                "sweeper": {"params": {"optim.lr": "1e-3,1e-2"}},
            }
        },
        tmp_path / "multirun.yaml",
    )
    job = ["normalizer=kl", "task.num_kv_pairs=4", "seed=0", "trainer.steps=9", "optim.lr=1e-2"]
    assert job_name(5, str(tmp_path), job) == "5_normalizer=kl,task.num_kv_pairs=4,optim.lr=1e-2"
    assert job_name(0, str(tmp_path), ["seed=0"]) == "0"
    assert job_name(1, str(tmp_path / "none"), ["seed=0", "x=a/b"]) == "1_seed=0,x=a-b"  # no multirun.yaml: all
    long = job_name(2, str(tmp_path), ["normalizer=" + "k" * 300])
    assert len(long) == len("2_") + MAX_NAME + 9 and long != job_name(2, str(tmp_path), ["normalizer=" + "k" * 301])


def test_job_line_of_vmapped_seeds_and_of_a_failed_job(tmp_path):
    """Written by hand: a job of 3 vmapped seeds (one diverged) and a regression job without accuracy."""
    from attnlab.sweep.summary import job_line

    job = tmp_path / "4_normalizer=kl"
    for seed, (status, acc) in enumerate([("completed", 0.5), ("completed", 0.7), ("diverged", 0.0)]):
        (job / f"seed{seed}").mkdir(parents=True)
        (job / f"seed{seed}" / "metrics.json").write_text(
            json.dumps({"status": status, "final": {"test/accuracy": acc}, "headline": "test/accuracy"})
        )
    (job / "seeds.json").write_text("{}")
    assert (
        job_line(job, 12.34)
        == "job 4_normalizer=kl: 2 completed, 1 diverged  test/accuracy 0.6000 (mean of 2 seeds)  12.3s"
    )
    reg = tmp_path / "5_task=icl_regression"
    reg.mkdir()
    (reg / "metrics.json").write_text(
        json.dumps({"status": "completed", "final": {"test/r2": 0.25, "test/mse": 2.0}, "headline": "test/mse"})
    )
    assert job_line(reg, 1.0) == "job 5_task=icl_regression: completed  test/mse 2.0000  1.0s"
    bad = tmp_path / "6_x=1"
    bad.mkdir()
    (bad / "metrics.json").write_text(json.dumps({"status": "failed", "error": "configuration: " + "x" * 200}))
    assert job_line(bad, 0.5) == f"job 6_x=1: failed  configuration: {'x' * 82}...  0.5s"
    assert job_line(tmp_path / "7_gone", 0.0) == "job 7_gone: unfinished  0.0s"
