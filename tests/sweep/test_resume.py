"""An interrupted sweep resumes from the command its interrupt message prints: a real SIGINT in the middle of a
job of a real `-m` sweep, then that command; every job completes exactly once, the interrupted one from its
checkpoint."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from cli_helpers import TINY, events, metrics, tiny_task
from omegaconf import OmegaConf

from attnlab import exits
from attnlab.run.files import finished_with
from attnlab.sweep.definition import resume_command

STEPS = 100
SWEEP = [
    *TINY,
    *tiny_task("mqar"),
    f"trainer.steps={STEPS}",
    "trainer.log_every=10",
    "trainer.eval_every=50",
    "trainer.checkpoint_every=10",
]


def test_resume_command_pins_the_sweep_dir_and_keeps_the_sweeps_own_overrides(tmp_path):
    OmegaConf.save(
        {
            "hydra": {
                "overrides": {
                    "task": ["normalizer=softmax,linear", "model.layer_normalizers=[softmax,linear]"],
                    "hydra": ["hydra.mode=MULTIRUN", "hydra/launcher=joblib", f"hydra.sweep.dir={tmp_path}/old"],
                }
            }
        },
        tmp_path / "multirun.yaml",
    )
    cmd = shlex.split(resume_command(tmp_path, "/x/attnlab/__main__.py"))
    assert cmd == [
        sys.executable,
        "-m",
        "attnlab",
        "-m",
        "normalizer=softmax,linear",
        "model.layer_normalizers=[softmax,linear]",
        "hydra/launcher=joblib",
        f"hydra.sweep.dir={tmp_path}",
    ]
    assert shlex.split(resume_command(tmp_path, "/usr/bin/attnlab-train"))[:2] == ["attnlab-train", "-m"]


@pytest.mark.slow  # ~35 s CPU: three jobs' start-up and compile, in two processes
def test_sigint_mid_job_then_the_printed_command_completes_every_job_once(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "-m", "seed=0,1,2", *SWEEP, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not (sweep / "1_seed=1" / "checkpoints" / "10").exists():  # job 1 is training
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == exits.INTERRUPTED and "Traceback" not in err, err[-3000:]
    first = {job: metrics(sweep / job) for job in ("0_seed=0", "1_seed=1")}
    assert not (sweep / "2_seed=2").exists()  # never started
    assert first["0_seed=0"]["status"] == "completed"
    assert first["1_seed=1"]["status"] == "interrupted" and 10 <= first["1_seed=1"]["steps"] < STEPS
    done_at = (sweep / "0_seed=0" / "metrics.json").stat().st_mtime_ns
    command = re.search(r"resume it with:\n\s+(.+)", err).group(1)

    resumed = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "0_seed=0 already completed" in resumed.stderr
    assert (sweep / "0_seed=0" / "metrics.json").stat().st_mtime_ns == done_at  # not run twice
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0_seed=0", "1_seed=1", "2_seed=2"]
    for job, resumed_from in (("1_seed=1", first["1_seed=1"]["steps"]), ("2_seed=2", None)):
        m = metrics(sweep / job)
        assert (m["status"], m["steps"], m["resumed_from"]) == ("completed", STEPS, resumed_from), (job, m)
    logged = [e.step for e in events(sweep / "1_seed=1").Scalars("train/loss")]  # each step once, none missing
    assert logged == list(range(10, STEPS + 1, 10)), logged


def _write_run(run_dir, config, status, seeds=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    if seeds is None:
        (run_dir / "run.json").write_text(json.dumps({"config": config}))
        (run_dir / "metrics.json").write_text(json.dumps({"status": status}))
    else:
        (run_dir / "seeds.json").write_text(
            json.dumps({"config": config, "seeds": {str(s): {"status": st} for s, st in zip(seeds, status)}})
        )


@pytest.mark.parametrize(
    ("status", "seeds", "final"),
    [
        ("completed", None, "completed"),
        ("diverged", None, "diverged"),
        ("interrupted", None, None),
        ("failed", None, None),
        (["completed", "diverged"], [0, 1], "diverged"),
        (["completed", "completed"], [0, 1], "completed"),
        (["diverged", "interrupted"], [0, 1], None),
    ],
)
def test_a_resumed_sweep_skips_completed_and_diverged_jobs_only(tmp_path, status, seeds, final):
    config = {"seed": 0, "trainer": {"steps": 9, "resume": False}, "optim": {"lr": 1000.0}}
    _write_run(tmp_path, config, status, seeds)
    assert finished_with(tmp_path, {**config, "trainer": {"steps": 9, "resume": True}}) == final  # resume aside
    assert finished_with(tmp_path, {**config, "optim": {"lr": 1.0}}) is None  # another config runs again


@pytest.mark.slow  # ~25 s CPU: a two-job sweep, then its resume command (both jobs skipped)
def test_a_diverged_sweep_job_is_not_run_again_on_resume(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    sweep = tmp_path / "sweep"
    first = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab",
            "-m",
            "optim.lr=100000.0,0.001",
            *TINY,
            *tiny_task("mqar"),
            "trainer.steps=40",
            "trainer.log_every=2",
            "trainer.checkpoint_every=2",
            "optim.warmup_steps=0",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == exits.DIVERGED, first.stderr[-3000:]  # the sweep's most urgent outcome
    jobs = {j: metrics(sweep / j) for j in ("0_optim.lr=100000.0", "1_optim.lr=0.001")}
    assert [m["status"] for m in jobs.values()] == ["diverged", "completed"], jobs
    assert (sweep / "0_optim.lr=100000.0" / "checkpoints").is_dir()  # what a resume would have continued from
    written = {j: (sweep / j / "metrics.json").stat().st_mtime_ns for j in jobs}
    again = subprocess.run(
        resume_command(sweep, "/x/attnlab/__main__.py"),
        shell=True,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == exits.DIVERGED, again.stderr[-3000:]  # the skipped jobs' outcomes, as before
    assert "0_optim.lr=100000.0 already diverged" in again.stderr
    assert "1_optim.lr=0.001 already completed" in again.stderr
    assert {j: (sweep / j / "metrics.json").stat().st_mtime_ns for j in jobs} == written  # neither ran again
    assert metrics(sweep / "0_optim.lr=100000.0")["steps"] == jobs["0_optim.lr=100000.0"]["steps"]


def test_a_signal_during_a_checkpoint_call_waits_for_it_then_reaches_the_installed_handler():
    from attnlab.sweep.signals import signals_held

    seen, during = [], []

    @signals_held
    def write():
        os.kill(os.getpid(), signal.SIGTERM)  # delivered at once to the holding handler
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        during.extend(seen)
        return "written"

    old = {s: signal.signal(s, lambda signum, frame: seen.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert write() == "written"
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert during == [] and seen == [signal.SIGTERM]  # after the call, once: the first signal that came
