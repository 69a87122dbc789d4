"""scripts/bench_common.py: interleaving order, paired ratios, memory and Markdown sections, by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_common as bc  # noqa: E402


def test_interleave_rotates_reverses_and_drops_the_warmup():
    calls = []
    samplers = {n: (lambda n=n: calls.append(n) or len(calls)) for n in "abc"}
    out = bc.interleave(samplers, rounds=3)
    # round 0 (warm-up) abc; round 1 rotated to bca and reversed; round 2 cab; round 3 abc reversed
    assert "".join(calls) == "abc" + "acb" + "cab" + "cba"
    assert out == {"a": [4, 8, 12], "b": [6, 9, 11], "c": [5, 7, 10]}


def test_paired_ratio_is_the_median_of_per_round_ratios():
    assert bc.paired_ratio([2.0, 9.0, 3.0], [1.0, 3.0, 2.0]) == "2.00 (1.50–3.00)"


def test_peak_bytes_of_a_program_without_temporaries():
    compiled = jax.jit(lambda x: x + 1).lower(jnp.zeros((1024,), jnp.float32)).compile()
    ma = compiled.memory_analysis()
    assert bc.peak_bytes(compiled) == ma.temp_size_in_bytes + 2 * 4096 - ma.alias_size_in_bytes


def test_write_section_replaces_only_its_section(tmp_path):
    path = tmp_path / "B.md"
    path.write_text("# Benchmarks\n\n## A\nold a\n\n## B\nold b\n")
    bc.write_section("## A\nnew a\n", path, ("## A",))
    assert path.read_text() == "# Benchmarks\n\n## A\nnew a\n\n## B\nold b\n"
    assert bc.table(["x", "y"], [[1, 2]], "---:|---") == ["| x | y |", "|---:|---|", "| 1 | 2 |"]


def test_bench_gpu_without_a_gpu_says_so_and_exits_0():
    import os
    import subprocess

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_gpu.py"
    proc = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("bench_gpu: no GPU (JAX ") and "sees cpu); nothing measured" in proc.stdout


def test_bench_gpu_mfu_is_model_flops_over_peak():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_gpu

    # 1e9 FLOP per token (6·params + 12·L·T·d with params = 1e9/6 − 2·L·T·d), 1e3 tokens in 1 ms: 1e15 FLOP/s
    n = (1e9 - 12 * 8 * 1000 * 512) / 6
    assert abs(bench_gpu.mfu(n, 1, 1000, 1.0, 1000.0) - 1.0) < 1e-12


@pytest.mark.slow  # two compiles and an lm task: 122 s on the shared 2-core machine under load
def test_bench_gpu_times_the_step_a_run_trains_with(tmp_path):
    """bench_gpu's attnlab step is the run's: the run's matmul precision (bfloat16: the platform default,
    not the suite's pinned "highest"), batches drawn from the lm text stream, and the same first-step
    loss and parameters as the step train.fit compiles for `attnlab-train` with the same overrides."""
    import bench_gpu
    import numpy as np

    from attnlab.accelerator import data_mesh
    from attnlab.config import assembly
    from attnlab.tasks.lm.host_stream import TextWindows
    from attnlab.train import fit

    overrides = bench_gpu.run_overrides("softmax", 2, 32, "bfloat16", "tiny") + ["accelerator=cpu"]
    run = bench_gpu.attnlab_run(overrides)
    assert jax.config.jax_default_matmul_precision == "default"
    assert isinstance(run["data"], TextWindows)  # the stream, not the fixed split's windows
    bench_state, bench_metrics = run["steps"].plain(run["state"], run["data"])

    cfg = bench_gpu.compose(overrides + ["trainer.progress=none"])
    task, nets, tx, loop = assembly.assemble(cfg, cfg.task.default_head)
    got = {}

    class Stop(Exception):
        pass

    def capture(steps, state, data):
        got["state"], got["metrics"] = steps.plain(state, data)
        raise Stop

    try:
        fit(
            nets,
            task,
            tx,
            loop,
            mesh=data_mesh(),
            run_dirs=[tmp_path / "run"],
            checkpoint_dir=tmp_path / "ckpt",
            on_compiled=capture,
        )
    except Stop:
        pass
    assert float(bench_metrics["loss"][0]) == float(got["metrics"]["loss"][0])
    for a, b in zip(jax.tree.leaves(bench_state["params"]), jax.tree.leaves(got["state"]["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
