"""Interruption and resume, corrupt checkpoints, and the non-finite policies, through the real CLI (its SIGTERM in a
process of its own; the rest in this process, cli_helpers.train_in_process)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import TINY, events, metrics, scalar_curve, tiny_task, train_in_process

from attnlab import exits

RUN = [
    *TINY,
    *tiny_task("mqar"),
    "trainer.steps=40",
    "trainer.log_every=2",
    "trainer.eval_every=10",
    "trainer.progress=lines",
]


def curves(run_dir, tags=("train/loss", "grad_norm/global", "val/loss", "attn_entropy/layer_0/head_0")):
    return {tag: scalar_curve(run_dir, tag) for tag in tags}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    train_in_process(*RUN, "trainer.checkpoint_every=10", f"hydra.run.dir={root / 'r'}", cwd=root)
    return root / "r"


def test_sigterm_then_resume_equals_an_uninterrupted_run(tmp_path, uninterrupted):
    """A real SIGTERM mid-training: exit 130, no final metrics, and the resume command printed; that command, as
    printed, finishes the run, bit-identical to one never interrupted."""
    run_dir = tmp_path / "r"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", *RUN, "trainer.checkpoint_every=0", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in proc.stdout:  # interrupt once training is under way
        assert not line.startswith("ran:"), "finished before the signal"
        if line.startswith("step 14:"):
            assert "(14/40, " in line and " left)" in line, line
            proc.send_signal(signal.SIGTERM)
            break
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == exits.INTERRUPTED, out[-3000:]
    first = metrics(run_dir)
    assert first["status"] == "interrupted" and 14 <= first["steps"] < 40 and first["final"] == {}, first
    assert "final metrics" not in out and "headline:" not in out, out[-3000:]  # no metrics of an unfinished run
    resume = [line.split("resume: ", 1)[1] for line in out.splitlines() if line.startswith("resume: ")]
    assert len(resume) == 1, out
    argv = shlex.split(resume[0])
    assert argv[0] == "attnlab-train" and f"hydra.run.dir={run_dir}" in argv and "trainer.resume=true" in argv
    resumed_run = train_in_process(*argv[1:], cwd=tmp_path)
    assert (
        f"attnlab: resumed from step {first['steps']} of 40 (checkpoint {run_dir / 'checkpoints'}/{first['steps']})"
    ) in resumed_run.stderr
    resumed, full = metrics(run_dir), metrics(uninterrupted)
    assert resumed["status"] == "completed" and resumed["resumed_from"] == first["steps"]
    # Bit-identical on CPU: the same final and best metrics, the same logged curves, no step twice or missing.
    assert resumed["final"] == full["final"]
    assert resumed["best"] == full["best"]
    got, want = curves(run_dir), curves(uninterrupted)
    for tag in want:
        assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]], tag
        np.testing.assert_array_equal([v for _, v in got[tag]], [v for _, v in want[tag]], err_msg=tag)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path, uninterrupted):
    run_dir = tmp_path / "r"
    shutil.copytree(uninterrupted, run_dir)
    ckpts = run_dir / "checkpoints"
    steps = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
    assert steps == [30, 40]  # periodic every 10, the last 2 kept
    for path in (ckpts / "40").rglob("*"):
        if path.is_file():
            path.write_bytes(b"\0garbage")
    (run_dir / "metrics.json").unlink()
    with pytest.warns(UserWarning, match="is unreadable .*; falling back to an earlier one"):
        train_in_process(*RUN, "trainer.resume=true", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    m = metrics(run_dir)
    assert m["status"] == "completed" and m["resumed_from"] == 30
    assert m["final"] == metrics(uninterrupted)["final"]


def test_no_usable_checkpoint_is_a_clear_error(tmp_path, uninterrupted):
    run_dir = tmp_path / "r"
    shutil.copytree(uninterrupted, run_dir)
    for path in (run_dir / "checkpoints").rglob("*"):
        if path.is_file():
            path.write_bytes(b"\0garbage")
    proc = train_in_process(*RUN, "trainer.resume=true", f"hydra.run.dir={run_dir}", cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "no usable checkpoint" in proc.stderr and "Traceback" not in proc.stderr


DIVERGE = [
    *TINY,
    *tiny_task("mqar"),
    "normalizer=squared",
    "normalizer.eps=0",
    "optim.lr=1e6",
    "optim.warmup_steps=0",
    "trainer.steps=12",
    "trainer.log_every=4",
    "trainer.eval_every=12",
]


def test_stop_policy_ends_the_run_as_diverged_with_a_diagnostic(tmp_path):
    proc = train_in_process(
        *DIVERGE, "trainer.nonfinite=stop", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path, check=False
    )
    m = metrics(tmp_path / "r")
    assert proc.returncode == 3 and proc.stderr.count("attnlab: run diverged at step") == 1, proc.stderr
    assert m["status"] == "diverged" and "non-finite" in m["error"]
    diag = json.loads((tmp_path / "r" / "diverged.json").read_text())
    assert 1 <= diag["first_nonfinite_step"] <= m["steps"] <= 12
    assert np.asarray(diag["batch"]["inputs"]).shape == (8, 16)
    assert any(k.startswith("attn_min_denominator/") for k in diag["last_logged"])


def test_skip_policy_counts_nonfinite_steps_and_keeps_going(tmp_path):
    """max_skipped=1: every step may be skipped, so the run goes on to the end, where its NaN test loss
    (finite but huge parameters) makes it diverged, not completed."""
    proc = train_in_process(
        *DIVERGE,
        "trainer.nonfinite=skip",
        "trainer.max_skipped=1",
        f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
        check=False,
    )
    m = metrics(tmp_path / "r")
    assert m["steps"] == 12 and m["nonfinite_steps"] > 0
    assert proc.returncode == 3 and m["status"] == "diverged" and "test/loss" in m["diverged"]["reason"]
    assert m["diverged"]["step"] == json.loads((tmp_path / "r" / "diverged.json").read_text())["first_nonfinite_step"]
    assert "test/loss" not in m["final"] and all(np.isfinite(v) for v in m["final"].values())
    counts = [v for _, v in scalar_curve(tmp_path / "r", "train/nonfinite_steps")]
    assert counts == sorted(counts) and counts[-1] == m["nonfinite_steps"]
    acc = events(tmp_path / "r")  # a non-finite value (the loss of a skipped step) never reaches the writer
    assert all(np.isfinite(e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag))


def test_sweep_with_refused_draws_completes_the_others(tmp_path):
    """heads=0 and dropout=1.5 are refused in their own job (one line each); the valid draws still train."""
    proc = train_in_process(
        "-m",
        "model.heads=0,2",
        "model.dropout=1.5,0.0",
        *TINY,
        *tiny_task("mqar"),
        f"hydra.sweep.dir={tmp_path}",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == exits.REFUSED, proc.stderr  # two jobs refused, none failed
    status = {p.name: metrics(p) for p in tmp_path.iterdir() if (p / "metrics.json").exists()}
    assert len(status) == 4, sorted(status)
    for name, m in status.items():
        bad = "heads=0" in name or "dropout=1.5" in name
        assert m["status"] == ("failed" if bad else "completed"), (name, m)
        if bad:
            assert m["error"].startswith("configuration: model.") and "allowed" in m["error"], m["error"]
        else:
            assert m["steps"] == 4 and np.isfinite(m["final"]["test/loss"])
    assert "1 completed, 3 refused" in proc.stderr and "Traceback" not in proc.stderr


def _progress(sweep_dir) -> set[str]:
    """What a sweep has achieved so far: checkpoints written and runs finished."""
    return {str(p) for p in sweep_dir.glob("*/checkpoints/*")} | {str(p) for p in sweep_dir.glob("*/metrics.json")}


@pytest.mark.slow
def test_soak_sweep_with_random_sigterms_completes_every_run_once(tmp_path):
    """20 tiny runs; SIGTERM at random moments (during start-up, or at a random time after the sweep made
    progress), then the same command again until done: every run completes exactly once (a completed run
    is never re-run) and TensorBoard holds each logged step once."""
    import random
    import time

    rng, seeds, steps, max_kills = random.Random(13), range(20), 20, 8
    cmd = [
        sys.executable,
        "-m",
        "attnlab",
        "-m",
        "seed=" + ",".join(map(str, seeds)),
        *TINY,
        *tiny_task("mqar"),
        f"trainer.steps={steps}",
        "trainer.log_every=2",
        "trainer.eval_every=10",
        "trainer.checkpoint_every=5",
        f"hydra.sweep.dir={tmp_path}",
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    completed_at: dict[str, int] = {}  # job -> metrics.json mtime when first seen completed
    kills = 0
    for _ in range(40):
        before = _progress(tmp_path)
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        if kills < max_kills:
            if rng.random() < 0.25:  # during start-up
                time.sleep(rng.uniform(0.5, 5.0))
            else:  # somewhere in a run, once the sweep has moved on
                while proc.poll() is None and _progress(tmp_path) == before:
                    time.sleep(0.3)
                time.sleep(rng.uniform(0.0, 6.0))
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                kills += 1
        err = proc.communicate(timeout=1200)[1]
        assert "Traceback" not in err, err[-3000:]
        for job in tmp_path.glob("*_seed=*"):
            if (job / "metrics.json").exists() and metrics(job)["status"] == "completed":
                mtime = (job / "metrics.json").stat().st_mtime_ns
                assert completed_at.setdefault(job.name, mtime) == mtime, f"{job.name} completed twice"
        if proc.returncode == 0 and len(completed_at) == len(seeds):
            break
    assert kills >= 4 and len(completed_at) == len(seeds), (kills, sorted(completed_at))
    for job in tmp_path.glob("*_seed=*"):
        m = metrics(job)
        assert m["status"] == "completed" and m["steps"] == steps, (job.name, m)
        acc = events(job)
        for tag, every in (("train/loss", 2), ("val/loss", 10)):
            logged = [e.step for e in acc.Scalars(tag)]
            assert logged == list(range(every, steps + 1, every)), (job.name, tag, logged)
