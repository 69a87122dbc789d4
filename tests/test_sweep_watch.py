"""A sweep you can watch, on real Hydra multiruns: each job's progress lines labelled by job under joblib, the
records' convergence and plateau flags read back from the run's own events, and attnlab-report on a sweep that is
still running."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
from cli_helpers import TINY, TINY_TASK, metrics, run_cli, scalar_curve

QUIET = "trainer.progress=none"
WATCHED = [o for o in TINY if o != QUIET]  # the sweep's own progress mode: lines, labelled


def test_joblib_jobs_print_labelled_progress_and_records_say_if_they_settled(tmp_path):
    steps = ["trainer.steps=8", "trainer.log_every=2", "trainer.eval_every=2"]
    proc = run_cli(
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "normalizer=softmax,linear",
        *WATCHED,
        *TINY_TASK["mqar"],
        *steps,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    jobs = ["0_normalizer=softmax", "1_normalizer=linear"]
    for job in jobs:
        logged = [s for s, _ in scalar_curve(tmp_path / "sweep" / job, "train/loss")]
        assert logged == [2, 4, 6, 8]
        # one labelled line per logged step, with the step, the total and the loss the job logged
        printed = re.findall(
            rf"^\[{re.escape(job)}\] step (\d+): loss \d+\.\d{{4}}  \(\1/8, [\d:?]+ left\)$", proc.stdout, re.M
        )
        assert [int(s) for s in printed] == logged, proc.stdout[-2000:]
        assert re.search(rf"^\[{re.escape(job)}\] attnlab: attention_impl per layer: ", proc.stderr, re.M)
    # reading a job's events for its record logs nothing into its Hydra log (cli.log)
    assert not [p for p in (tmp_path / "sweep").rglob("*.log") if "tensorboard" in p.read_text()]
    # no job's line goes out unlabelled: every progress and attention_impl line carries a job's name
    assert not re.search(r"^(step \d+:|attnlab: attention_impl)", proc.stdout + proc.stderr, re.M)

    for job in jobs:
        rec = metrics(tmp_path / "sweep" / job)
        curve = dict(scalar_curve(tmp_path / "sweep" / job, "val/loss"))  # evaluations at 2, 4, 6, 8
        x = np.array([4.0, 6.0, 8.0])  # the last half of 8 steps
        y = np.array([curve[4], curve[6], curve[8]])
        drop = -np.polyfit(x, y, 1)[0] * 4 / y.mean()
        conv = rec["convergence"]
        assert conv["window"] == [4, 8] and conv["evals"] == 3
        assert abs(conv["relative_drop"] - drop) < 1e-9 and conv["val_loss_falling"] == bool(drop > 0.01)
        [row] = rec["plateaus"]["test/accuracy"]  # TINY's MQAR has 2 pairs: the 1/pairs plateau is 0.5
        acc = rec["final"]["test/accuracy"]
        assert (row["label"], row["value"]) == ("1/pairs", 0.5)
        assert row["at"] == (0.45 <= acc <= 0.55)


def test_report_on_a_running_sweep_says_what_is_done_and_what_still_runs(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    tiny = [o for o in TINY if not o.startswith(("trainer.steps=", "trainer.eval_every="))]
    cmd = [sys.executable, "-m", "attnlab", "-m", "trainer.steps=4,5000", *tiny, *TINY_TASK["mqar"]]
    cmd += ["trainer.eval_every=1000", f"hydra.sweep.dir={sweep}"]
    log = (tmp_path / "sweep.log").open("w")
    sweep_proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        first, second = sweep / "0_trainer.steps=4", sweep / "1_trainer.steps=5000"
        deadline = time.time() + 300
        while time.time() < deadline:  # until the long job has flushed a logged step (tensorboardX: every 30 s)
            if (first / "metrics.json").exists() and scalar_steps(second):
                break
            time.sleep(2)
        else:
            raise AssertionError(f"the long job logged no step within 300 s: {(tmp_path / 'sweep.log').read_text()}")
        report = subprocess.run(
            [sys.executable, "-m", "attnlab.report.cli", str(sweep), "--curves"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert report.returncode == 0, report.stderr[-2000:]
        out = report.stdout
        assert "1 of 2 runs completed; missing: 1_trainer.steps=5000 (incomplete)." in out
        line = next(t for t in out.splitlines() if t.startswith("- 1_trainer.steps=5000: "))
        step = int(re.search(r"running: step (\d+)/5000, train loss [\d.]+ \(last written \d+ s ago\)", line).group(1))
        assert step in scalar_steps(second)  # a step the job had logged when the report read it
        assert "## Still running" in out and out.index("## Still running") < out.index("## Verdict")
    finally:
        sweep_proc.send_signal(signal.SIGTERM)  # the sweep checkpoints the long job and stops
        sweep_proc.wait(timeout=300)


def scalar_steps(run_dir) -> list[int]:
    """The train/loss steps a run's event file holds so far (none before its first flush)."""
    if not run_dir.is_dir() or not list(run_dir.glob("events.out.tfevents.*")):
        return []
    try:
        return [s for s, _ in scalar_curve(run_dir, "train/loss")]
    except KeyError:
        return []


def test_report_on_a_sweep_without_any_record_yet(tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "0_normalizer=softmax" / ".hydra").mkdir(parents=True)
    overrides = ["normalizer=softmax,linear"]
    (sweep / "multirun.yaml").write_text(
        json.dumps({"hydra": {"overrides": {"task": overrides}, "sweeper": {"params": None}}})
    )
    proc = subprocess.run(
        [sys.executable, "-m", "attnlab.report.cli", str(sweep)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "0 of 2 runs completed; missing: 0_normalizer=softmax (started, building), 1_normalizer=linear (not started).",
        "No run has written its record yet; run attnlab-report again once one has.",
    ]
