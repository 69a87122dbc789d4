"""A sweep you can watch, on real Hydra multiruns: each job's progress lines labelled by job under joblib, the
records' convergence and plateau flags read back from the run's own events, and attnlab-report on a sweep that is
still running."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from cli_helpers import TINY, metrics, run_cli, scalar_curve, tiny_task
from scipy import stats

QUIET = "trainer.progress=none"
WATCHED = [o for o in TINY if o != QUIET]  # the sweep's own progress mode: lines, labelled


@pytest.mark.long  # ~35 s: a joblib sweep, its jobs in their own processes
def test_joblib_jobs_print_labelled_progress_and_records_say_if_they_settled(tmp_path):
    steps = ["trainer.steps=8", "trainer.log_every=2", "trainer.eval_every=2", "trainer.vmap_seeds=3"]
    proc = run_cli(
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "normalizer=softmax,linear",
        *WATCHED,
        *tiny_task("mqar"),
        *steps,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    jobs = ["0_normalizer=softmax", "1_normalizer=linear"]
    for job in jobs:
        logged = [s for s, _ in scalar_curve(tmp_path / "sweep" / job / "seed0", "train/loss")]
        assert logged == [2, 4, 6, 8]
        # one labelled line per logged step, with the step, the total and the loss (mean over the job's seeds)
        printed = re.findall(
            rf"^\[{re.escape(job)}\] step (\d+): loss \d+\.\d{{4}}  \(\1/8, [\d:?]+ left\)$", proc.stdout, re.M
        )
        assert [int(s) for s in printed] == logged, proc.stdout[-2000:]
        assert re.search(rf"^\[{re.escape(job)}\] attnlab: attention_impl per layer: ", proc.stderr, re.M)
    # reading a job's events for its record logs nothing into its Hydra log (cli.log)
    assert not [p for p in (tmp_path / "sweep").rglob("*.log") if "tensorboard" in p.read_text()]
    # no job's line goes out unlabelled: every progress and attention_impl line carries a job's name
    assert not re.search(r"^(step \d+:|attnlab: attention_impl)", proc.stdout + proc.stderr, re.M)

    records = {job: [metrics(tmp_path / "sweep" / job / f"seed{k}") for k in range(3)] for job in jobs}
    for job in jobs:
        for k, rec in enumerate(records[job]):
            curve = dict(scalar_curve(tmp_path / "sweep" / job / f"seed{k}", "val/loss"))  # evaluations 2, 4, 6, 8
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
    check_the_verdict(tmp_path / "sweep", records)


def hand_power(effect, sd, n, alpha):
    """Two-sided paired t-test power from the noncentral t distribution (Cohen 1988, ch. 2)."""
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    nc = abs(effect) / sd * math.sqrt(n)
    lower = stats.nct.cdf(-crit, n - 1, nc)
    return stats.nct.sf(crit, n - 1, nc) + (lower if np.isfinite(lower) else 0.0)


def check_the_verdict(sweep, records):
    """attnlab-report on the real sweep: its verdict on linear against softmax, recomputed from the runs' records."""
    out = subprocess.run(
        [sys.executable, "-m", "attnlab.report.cli", str(sweep), "--curves"],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    acc = {job: np.array([r["final"]["test/accuracy"] for r in recs]) for job, recs in records.items()}
    soft, lin = acc["0_normalizer=softmax"], acc["1_normalizer=linear"]
    d = lin - soft
    lines = out.splitlines()  # the item, unfolded: report.md folds its prose at 120 columns (report.write)
    first = next(k for k, t in enumerate(lines) if t.startswith("- **test/accuracy**"))
    folded = itertools.takewhile(lambda t: t.startswith("  "), lines[first + 1 :])
    line = " ".join([lines[first], *(t.strip() for t in folded)])
    p = stats.ttest_rel(lin, soft).pvalue if d.any() else 1.0  # one test: Holm leaves it as it is
    tost = max(
        stats.ttest_1samp(d, -0.01, alternative="greater").pvalue, stats.ttest_1samp(d, 0.01, alternative="less").pvalue
    )
    if not d.any():
        assert "identical to it" in line
    elif p <= 0.05:
        assert "differ from normalizer=softmax beyond seed noise: normalizer=linear (" in line and f"p={p:.3g}" in line
    elif tost <= 0.05:
        assert "equivalent to it within the margin: normalizer=linear (within ±0.01" in line
    else:
        found = re.search(
            r"these 3 seeds detect \|Δ\| >= ([\d.e+-]+) at 80% power, the observed Δ needs (\d+) seeds", line
        )
        assert "not resolved (neither a difference nor equivalence within ±0.01): normalizer=linear: Δ in [" in line
        detectable, needed = float(found.group(1)), int(found.group(2))
        sd = d.std(ddof=1)
        assert abs(hand_power(detectable, sd, 3, 0.05) - 0.8) < 0.01  # printed to 3 significant figures
        assert hand_power(d.mean(), sd, needed, 0.05) >= 0.8 > hand_power(d.mean(), sd, needed - 1, 0.05)
    # a cell sits at the plateau when at least 2 of its 3 seeds do (then the sweep cannot rank it), and was still
    # learning when at least 2 of its 3 seeds' val loss still fell short of solving the task (then it is ranked at
    # its budget)
    plateaued = [sum(r["plateaus"]["test/accuracy"][0]["at"] for r in recs) >= 2 for recs in records.values()]
    learning = [
        sum(bool(r["convergence"]["val_loss_falling"]) and r["final"]["test/accuracy"] < 0.99 for r in recs) >= 2
        for recs in records.values()
    ]
    assert ("**This sweep cannot rank these cells**" in out) == all(plateaued), out[:3000]
    assert ("**Ranked at the budget given**" in out) == (not all(plateaued) and any(learning)), out[:3000]


@pytest.mark.long  # ~40 s: it waits for a running job's TensorBoard writer to flush (every 30 s)
def test_report_on_a_running_sweep_says_what_is_done_and_what_still_runs(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    tiny = [o for o in TINY if not o.startswith(("trainer.steps=", "trainer.eval_every="))]
    cmd = [sys.executable, "-m", "attnlab", "-m", "trainer.steps=4,5000", *tiny, *tiny_task("mqar")]
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
        step = int(
            re.search(r"running: step (\d+)/5000, train loss [\d.]+ \(last written \d+ (s|min) ago\)", line).group(1)
        )
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
