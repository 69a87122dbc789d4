"""Kill/resume soak: a real `-m` sweep stopped at seeded random moments by SIGINT or SIGTERM sent
to its process group (as a terminal's Ctrl-C or SLURM's preemption does), each time resumed with exactly the
command its interrupt message printed; in the end every job completed once and logged every step once.

Run it with `pytest -m slow -k soak` (ATTNLAB_SOAK_SEED=<n> draws other moments); bounded to about 3 minutes
(a few attempts, a timeout on each)."""

from __future__ import annotations

import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import TINY, events, metrics, tiny_task

from attnlab import exits

STEPS = 60
JOBS = ["0_seed=0", "1_seed=1", "2_seed=2"]
SWEEP = [
    "-m",
    "seed=0,1,2",
    *TINY,
    *tiny_task("mqar"),
    f"trainer.steps={STEPS}",
    "trainer.log_every=10",
    "trainer.eval_every=30",
    "trainer.checkpoint_every=10",
]
INTERRUPTIONS = 4  # then one attempt left alone to finish
ATTEMPT_TIMEOUT_S = 120
DEADLINE_S = 300  # the whole soak; about 3 minutes on 2 busy cores


def _launch(argv: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    # Its own session, hence its own process group: killpg reaches it (and any child) like a terminal or SLURM.
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _sweep_started(multirun_yaml: Path, since_ns: int) -> bool:
    """Hydra's sweeper (re)writes multirun.yaml just before it launches the jobs."""
    return multirun_yaml.exists() and multirun_yaml.stat().st_mtime_ns >= since_ns


def _completion_times(sweep: Path) -> dict[str, int]:
    """metrics.json's mtime of each completed job: a job completes once, so it never changes afterwards."""
    done = {}
    for job in JOBS:
        path = sweep / job / "metrics.json"
        if path.exists() and metrics(sweep / job).get("status") == "completed":
            done[job] = path.stat().st_mtime_ns
    return done


@pytest.mark.slow  # ~2-3 min: five launches of a three-job sweep (start-up, compile from the cache, training)
def test_random_sigint_sigterm_then_the_printed_command_completes_every_job_exactly_once(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    sweep = tmp_path / "sweep"
    rng = random.Random(int(os.environ.get("ATTNLAB_SOAK_SEED", "22")))  # other seeds: other moments
    argv = [sys.executable, "-m", "attnlab", *SWEEP, f"hydra.sweep.dir={sweep}"]
    t_end = time.monotonic() + DEADLINE_S
    completed_at: dict[str, int] = {}
    log = []
    for attempt in range(INTERRUPTIONS + 1):
        assert time.monotonic() < t_end, "soak over its time bound:\n" + "\n".join(log)
        started_ns = time.time_ns()
        proc = _launch(argv, tmp_path, env)
        sig = None
        if attempt < INTERRUPTIONS:
            while not _sweep_started(sweep / "multirun.yaml", started_ns) and proc.poll() is None:
                assert time.monotonic() < t_end, "sweep never started"
                time.sleep(0.02)
            # A random moment of the sweep: a job's start-up, its compile, training, evaluation, final metrics
            # or between jobs (the whole sweep takes about 15-30 s here).
            time.sleep(rng.uniform(0.2, 12.0))
            sig = rng.choice([signal.SIGINT, signal.SIGTERM])
            if proc.poll() is None:
                os.killpg(proc.pid, sig)
        try:
            out = proc.communicate(timeout=ATTEMPT_TIMEOUT_S)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"attempt {attempt} hung:\n" + proc.communicate()[0][-3000:]) from None
        log.append(f"attempt {attempt}: {sig and signal.Signals(sig).name} -> exit {proc.returncode}")
        (tmp_path / f"attempt{attempt}.log").write_text(out)
        assert "Traceback" not in out, f"{log[-1]}:\n{out[max(0, out.find('Traceback') - 2000) :][:5000]}"
        for job, t in _completion_times(sweep).items():  # a completed job is never run again
            assert completed_at.setdefault(job, t) == t, (job, "\n".join(log))
        if proc.returncode == 0:  # the sweep finished before (or without) the signal, in this attempt or earlier
            done = r"3 completed|nothing left to do, every job had already finished with this config \(3 completed\)"
            assert re.search(rf"sweep \S+: ({done})\n", out), out[-3000:]
            break
        match = re.search(r"resume it with:\n\s+(.+)", out)
        assert match, f"no resume command after {log[-1]}:\n{out[-4000:]}"
        argv = shlex.split(match.group(1))
        assert argv[-1] == f"hydra.sweep.dir={sweep}", argv
    else:
        raise AssertionError("the uninterrupted last attempt did not finish the sweep:\n" + "\n".join(log))

    assert sorted(completed_at) == JOBS, "\n".join(log)
    for job in JOBS:
        m = metrics(sweep / job)
        assert (m["status"], m["steps"]) == ("completed", STEPS), (job, m)
        logged = [e.step for e in events(sweep / job).Scalars("train/loss")]  # each step once, none missing
        assert logged == list(range(10, STEPS + 1, 10)), (job, logged, "\n".join(log))
    report = subprocess.run(
        [str(Path(sys.executable).parent / "attnlab-report"), str(sweep)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert "3 of 3 runs completed" in report.stdout + report.stderr, report.stdout[:2000]


def test_sigterm_to_the_group_as_the_sweep_starts_prints_the_resume_command(tmp_path):
    """SIGTERM's default action killed the sweep silently (exit -15, no resume command) outside the step loop."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    sweep = tmp_path / "sweep"
    started_ns = time.time_ns()
    proc = _launch([sys.executable, "-m", "attnlab", *SWEEP, f"hydra.sweep.dir={sweep}"], tmp_path, env)
    deadline = time.monotonic() + 60
    while not _sweep_started(sweep / "multirun.yaml", started_ns) and proc.poll() is None:
        assert time.monotonic() < deadline, "sweep never started"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)
    out = proc.communicate(timeout=ATTEMPT_TIMEOUT_S)[0]
    assert proc.returncode == exits.INTERRUPTED and "Traceback" not in out, out[-3000:]
    command = shlex.split(re.search(r"resume it with:\n\s+(.+)", out).group(1))
    assert command[command.index("-m", 2) + 1 :][: len(SWEEP) - 1] == SWEEP[1:], command  # the sweep's own overrides
    assert not any((sweep / job / "metrics.json").exists() for job in JOBS)  # nothing ran


def test_a_signal_python_cannot_raise_is_kept_quietly_and_stops_the_sweep(capsys):
    """Raised in a weakref callback (as in JAX's gc callback), the KeyboardInterrupt is ignored by Python: the
    soak saw a Ctrl-C lost that way, and an "Exception ignored ... Traceback" report."""
    import weakref

    from attnlab.sweep import signals as sw

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    old_hook, reported = sys.unraisablehook, []
    try:
        sys.unraisablehook = reported.append  # what Python would report ("Exception ignored ...")
        sw.catch_signals()

        def callback(_):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100_000):  # the handler runs here, inside the callback
                pass

        obj = type("Obj", (), {})()
        ref = weakref.ref(obj, callback)
        del obj
        assert ref() is None and sw._PENDING == [signal.SIGTERM]
        with pytest.raises(KeyboardInterrupt):
            sw.check_pending()
        assert reported == [] and "Exception ignored" not in capsys.readouterr().err
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        sys.unraisablehook = old_hook
        sw._PENDING.clear()
