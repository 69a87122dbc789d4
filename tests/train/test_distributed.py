"""One run over two processes on localhost, started the way SLURM starts the tasks of a two-node job step:
SLURM's variables (SLURM_NTASKS=2, SLURM_PROCID) with accelerator.distributed=true, so jax.distributed.initialize()
takes its SLURM path; one CPU device per process, JAX's gloo collectives between them. The run must be the
single-process run with the same global batch, written once (process 0), and resume after either process is killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import TINY, metrics, run_cli, scalar_curve, tiny_task

from attnlab import exits

STEPS = 40
RUN = [
    *TINY,
    *tiny_task("mqar"),
    f"trainer.steps={STEPS}",
    "trainer.log_every=2",
    "trainer.eval_every=20",
    "trainer.checkpoint_every=10",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(run_dir: Path, *extra: str) -> list[subprocess.Popen]:
    """The two tasks of one SLURM job step on this machine (srun would set these variables on two hosts)."""
    port, procs = _free_port(), []
    for rank in (0, 1):
        env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_NODELIST": "localhost",
            "SLURM_NTASKS": "2",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": "0",
            "JAX_COORDINATOR_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "attnlab",
                    *RUN,
                    "accelerator.distributed=true",
                    *extra,
                    f"hydra.run.dir={run_dir}",
                ],
                cwd=run_dir.parent,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def _wait(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    return [(p.wait(timeout=timeout), p.communicate()[0]) for p in procs]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The same run in one process on one device: the reference for the two-process run's numbers."""
    run_dir = tmp_path_factory.mktemp("one") / "r"
    run_cli(*RUN, f"hydra.run.dir={run_dir}", cwd=run_dir.parent)
    return run_dir


def _same_run(run_dir: Path, reference: Path) -> None:
    """Every logged step once (one writer) with the reference's losses; the same test metrics."""
    got, want = scalar_curve(run_dir, "train/loss"), scalar_curve(reference, "train/loss")
    assert [s for s, _ in got] == [s for s, _ in want] == list(range(2, STEPS + 1, 2))
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-5)
    done, ref = metrics(run_dir), metrics(reference)
    assert done["status"] == "completed" and done["steps"] == STEPS
    assert done["final"]["test/loss"] == pytest.approx(ref["final"]["test/loss"], rel=1e-5)


def _stop_then_resume(run_dir: Path, victim: int, sig: int) -> list[tuple[int, str]]:
    """Launch, kill `victim` once the step-10 checkpoint exists, then resume both tasks; the first launch's exits."""
    procs = _launch(run_dir)
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "10").exists():
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, _wait(procs, 5)
        time.sleep(0.05)
    procs[victim].send_signal(sig)
    if sig == signal.SIGKILL:  # a task lost: srun ends the step's other task too (--kill-on-bad-exit)
        procs[victim].wait(timeout=60)
        procs[1 - victim].kill()
    first = _wait(procs)
    resumed = _wait(_launch(run_dir, "trainer.resume=true"))
    assert all(code == 0 for code, _ in resumed), resumed
    assert all("attnlab: resumed from step " in out for _, out in resumed)
    return first


@pytest.mark.long  # ~50 s: two processes trained, signalled, then resumed
def test_two_processes_train_the_one_process_run_and_stop_together_for_a_signal_to_either(tmp_path, one_process):
    """SIGTERM (`kill`) to process 1 alone: both processes checkpoint at the same step and exit 130; the resumed
    run then equals the one-process run."""
    run_dir = tmp_path / "r"
    first = _stop_then_resume(run_dir, victim=1, sig=signal.SIGTERM)
    assert [code for code, _ in first] == [exits.INTERRUPTED] * 2, first
    stops = [line for _, out in first for line in out.splitlines() if line.startswith("attnlab: run stopped by signal")]
    assert len(stops) == 2 and stops[0] == stops[1], stops  # the same signal at the same step
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 2  # process 0's, one per launch
    _same_run(run_dir, one_process)


@pytest.mark.slow  # ~1.5 min on 2 cores: two launches of two processes
def test_a_killed_writer_process_resumes_from_the_last_periodic_checkpoint(tmp_path, one_process):
    """SIGKILL to process 0 (the writer): nothing saved at the kill, the resumed run continues from the last
    periodic checkpoint and still equals the one-process run (TensorBoard drops the steps logged after it)."""
    run_dir = tmp_path / "r"
    first = _stop_then_resume(run_dir, victim=0, sig=signal.SIGKILL)
    assert first[0][0] == -signal.SIGKILL
    _same_run(run_dir, one_process)
