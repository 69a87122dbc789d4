"""task=lm over task.device_text_bytes: the memory-mapped text streamed from the host (host_stream) draws the
device path's windows, replays them on resume, holds no copy of the text and trains identically."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from cli_helpers import TINY, scalar_curve, tiny_task, train_in_process

from attnlab import config
from attnlab.checks import ConfigError
from attnlab.config import assembly
from attnlab.steps import sample_batch, step_key
from attnlab.tasks.lm.host_stream import INT32_MAX, HostStream, TextWindows, host_starts, wide_bits, window_starts

SMALL = {"seq_len": 32, "n_train": 300, "n_val": 60, "n_test": 60}
KEYS_S2 = np.stack([jax.random.key_data(jax.random.key(s)) for s in (0, 7)])


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _device_windows(lm, steps, batch: int) -> np.ndarray:
    """(len(steps), S, B, seq_len + 1) bytes the device path's step draws, rebuilt from its batch."""
    data = jax.device_put(lm.batches(batch))
    draw = jax.jit(
        jax.vmap(
            jax.vmap(lambda k, s: sample_batch(data, step_key({"key": k, "step": s}), batch), (0, None)), (None, 0)
        )
    )
    b = draw(KEYS_S2, np.asarray(steps, np.int32))
    return np.concatenate([np.asarray(b["inputs"]) - 1, np.asarray(b["targets"])[..., -1:]], -1).astype(np.uint8)


def _stream(lm, start: int, stop: int, batch: int) -> np.ndarray:
    """The windows HostStream's grain loader yields for state steps start..stop − 1."""
    stream = lm.batches(batch, KEYS_S2, start=start, stop=stop)
    assert isinstance(stream, HostStream) and stream.streamed
    return np.stack([np.asarray(stream.next().windows) for _ in range(start, stop)])


def test_host_stream_draws_the_device_windows_and_replays_them_on_resume(cache):
    device = config.task("lm", **SMALL)
    host = config.task("lm", **SMALL, device_text_bytes=1000)
    assert (device.train_data, host.train_data) == ("device", "host-stream")
    # (a) steps 0..11 of two seeds: the same bytes as the device path's windows
    want = _device_windows(device, range(12), batch=8)
    got = _stream(host, 0, 12, batch=8)
    assert got.dtype == np.uint8 and got.shape == (12, 2, 8, 33)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got[:, 0], got[:, 1])  # each seed its own windows
    # (b) a run resumed after step 5 reads steps 5.. exactly as the uninterrupted run did
    np.testing.assert_array_equal(_stream(host, 5, 12, batch=8), want[5:])
    # (c) the text is a read-only map of the cache file, and the stream holds that map, not a copy
    text = host.text["train"]
    assert isinstance(text, np.memmap) and text.mode == "r" and str(cache) in str(text.filename)
    assert text.tobytes() == device.text["train"].tobytes()
    stream = host.batches(8, KEYS_S2)
    assert stream.text is text
    held = [v for v in vars(stream).values() if isinstance(v, np.ndarray) and not isinstance(v, np.memmap)]
    assert sum(v.nbytes for v in held) < 1000 < len(text)
    # the cache file is named by content: a second task maps it again instead of writing another
    written = Path(text.filename).stat().st_mtime_ns
    again = config.task("lm", **{**SMALL, "n_train": 10}, device_text_bytes=1000).text["train"]
    assert list((cache / "text").iterdir()) == [Path(text.filename)] == [Path(again.filename)]
    assert Path(text.filename).stat().st_mtime_ns == written


def test_offsets_past_int32_come_from_two_32_bit_draws():
    """Offsets beyond 2^31 (host path only): (hi·2^32 + lo) mod span from the step key's two draws; up to
    INT32_MAX the host path is the device's own formula. No text is allocated: the formula alone."""
    step, B = 3, 4096
    key_of = lambda kd: jax.random.fold_in(jax.random.wrap_key_data(kd), step)  # noqa: E731
    for span in (INT32_MAX, 2**31 - 1000):  # at the int32 boundary, the same numbers as the device draws
        device = np.stack([np.asarray(window_starts(key_of(kd), B, span)) for kd in KEYS_S2])
        np.testing.assert_array_equal(host_starts(KEYS_S2, step, B, span), device)
    for span in (2**31, 2**33 + 12345, 2**40 - 1):
        got = host_starts(KEYS_S2, step, B, span)
        for kd, row in zip(KEYS_S2, got):  # reference: Python integers, no uint64 arithmetic
            hi, lo = (np.asarray(x).tolist() for x in wide_bits(key_of(kd), B))
            assert row.tolist() == [(h * 2**32 + low) % span for h, low in zip(hi, lo)]
        assert got.min() >= 0 and got.max() < span
        # uniform over [0, span): the share of offsets past 2^31 is 1 − 2^31/span (binomial 5σ)
        share, p = (got >= 2**31).mean(), 1 - 2**31 / span
        assert abs(share - p) < 5 * np.sqrt(max(p * (1 - p), 1e-9) / got.size) + 1e-12


def test_device_path_refuses_a_text_past_int32_and_the_budget_says_so():
    text = jax.ShapeDtypeStruct((2**31 + 32,), np.uint8)  # abstract: traced, never allocated
    data = TextWindows(text, jax.ShapeDtypeStruct((33,), np.int32))
    with pytest.raises(ConfigError, match="device_text_bytes"):
        jax.eval_shape(lambda d: sample_batch(d, jax.random.key(0), 4), data)
    with pytest.raises(ConfigError) as e:
        config.task("lm", **SMALL, device_text_bytes=2**31)
    assert "device_text_bytes=2147483648" in str(e.value) and str(INT32_MAX) in str(e.value)
    assert "host" in str(e.value) and "\n" not in str(e.value)


def test_host_stream_steps_train_as_the_device_steps():
    """(d) The compiled steps fed by the host stream (fit's train_data and compile_steps) against the same
    steps drawing from the text on the device: the same loss at every step, logging steps included, and
    parameters equal after them to float32 rounding: within 1e-6 of each leaf's largest entry (the two programs are
    compiled apart, and XLA's CPU emitters may round a few entries of the embedding's gradient differently in each;
    a different batch moves the loss)."""
    from cli_helpers import compose_train
    from flax import nnx

    from attnlab.accelerator import data_mesh
    from attnlab.model.groups import leaf_groups
    from attnlab.steps import probes_per_layer
    from attnlab.train import train_data
    from attnlab.train.loop import compile_steps
    from attnlab.train.state import Placement, fresh_state

    S = 1  # one seed keeps the compile short; two seeds: the windows test above and the command-line test below
    cfg = compose_train(
        "model=tiny", "task=lm", *tiny_task("lm"), "accelerator=cpu", f"trainer.vmap_seeds={S}", "trainer.batch_size=8"
    )
    task, nets, tx, loop = assembly.assemble(cfg, "softmax_ce")
    host_task = config.task("lm", **{**task.options, "device_text_bytes": 1000})
    graphdef, params, _ = nnx.split(nets[0], nnx.Param, ...)
    groups, layers = leaf_groups(params)
    placement = Placement.of(data_mesh(), S)
    shape = dict(
        groups=groups,
        layers=layers,
        num_layers=len(nets[0].body.blocks),
        num_seeds=S,
        num_heads=nets[0].body.blocks[0].attn.num_heads,
        probe_layers=probes_per_layer(nets[0]),
    )
    states, losses, datas = {}, {}, {}
    for where, t in (("device", task), ("host", host_task)):
        states[where] = fresh_state(nets, tx, seed=0)
        datas[where] = train_data(t, placement, states[where], batch_size=8, start=0, stop=5)
        steps = compile_steps(graphdef, tx, states[where], datas[where], loop, placement, **shape)
        losses[where] = []
        for step in range(5):  # steps 0, 2, 4 are logging steps: statistics program, then the train step
            states[where], metrics = (steps.stats if step % 2 == 0 else steps.plain)(states[where], datas[where])
            losses[where].append(np.asarray(metrics["loss"]))
    assert isinstance(datas["host"], HostStream) and isinstance(datas["device"].text, jax.Array)
    np.testing.assert_array_equal(np.stack(losses["host"]), np.stack(losses["device"]))
    assert len({float(v) for v in np.ravel(losses["device"])}) == 5 * S  # the steps differ
    for a, b in zip(jax.tree.leaves(states["host"]["params"]), jax.tree.leaves(states["device"]["params"])):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * np.abs(b).max())


@pytest.mark.slow
def test_host_stream_trains_and_resumes_as_the_device_path(tmp_path):
    """(d) through the command line, two vmapped seeds, a logging step every step: a host-stream run and a
    host-stream run interrupted (SIGTERM) then resumed log the device run's losses, and run.json says which
    path ran."""
    common = [
        *TINY,
        "task=lm",
        *tiny_task("lm"),
        "trainer.steps=12",
        "trainer.log_every=1",
        "trainer.vmap_seeds=2",
        "trainer.checkpoint_every=0",
    ]
    runs = {}
    for where, budget in (("device", 2**30), ("host-stream", 1000)):
        run_dir = tmp_path / where
        proc = train_in_process(*common, f"task.device_text_bytes={budget}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert ("train_data: host-stream" in proc.stderr) == (where == "host-stream")
        for seed in (0, 1):
            assert json.loads((run_dir / f"seed{seed}" / "run.json").read_text())["train_data"] == where
        runs[where] = [scalar_curve(run_dir / f"seed{seed}", "train/loss") for seed in (0, 1)]
    host = [*common, "task.device_text_bytes=1000", "trainer.progress=lines", f"hydra.run.dir={tmp_path / 'resumed'}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", *host],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in proc.stdout:
        if line.startswith("step 4:"):
            proc.send_signal(signal.SIGTERM)
            break
    proc.communicate(timeout=300)
    first = json.loads((tmp_path / "resumed" / "seed0" / "metrics.json").read_text())
    assert first["status"] == "interrupted" and 4 <= first["steps"] < 12, first
    train_in_process(*host, "trainer.resume=true", cwd=tmp_path)
    runs["resumed"] = [scalar_curve(tmp_path / "resumed" / f"seed{seed}", "train/loss") for seed in (0, 1)]
    for seed in (0, 1):
        device = runs["device"][seed]
        assert [s for s, _ in device] == list(range(1, 13))
        for other in ("host-stream", "resumed"):
            assert [s for s, _ in runs[other][seed]] == list(range(1, 13)), other
            np.testing.assert_array_equal([v for _, v in runs[other][seed]], [v for _, v in device], err_msg=other)
    assert runs["device"][0] != runs["device"][1]


def test_diverged_json_of_a_host_stream_run_holds_the_device_batch():
    """records.diagnose re-gathers the first non-finite step's windows for that seed: the device path's batch."""
    from attnlab.train.final import diagnose

    device = config.task("lm", **SMALL)
    host = config.task("lm", **SMALL, device_text_bytes=1000)
    stream = host.batches(8, KEYS_S2)
    for i, kd in enumerate(KEYS_S2):
        state = {"key": kd, "first_nonfinite": np.int32(6), "step": np.int32(9)}
        # what run.files writes as diverged.json, through json as it is written and read
        got, want = (
            json.loads(json.dumps(diagnose(state, data, 8, {}))) for data in (stream, jax.device_put(device.batches(8)))
        )
        assert got == want and got["first_nonfinite_step"] == 7
        assert np.array_equal(np.asarray(got["batch"]["targets"]), _device_windows(device, [6], 8)[0, i, :, 1:])


def test_bigram_entropy_in_chunks_counts_every_pair_once():
    """Chunks (a corpus's int64 pairs would be 8× its size) overlap by one byte: the same joint counts."""
    from attnlab.tasks.lm import bigram_entropy_bits

    text = np.frombuffer(b"abracadabra, abracadabra; the cat sat on the mat" * 3, np.uint8)
    pairs = text[:-1].astype(np.int64) * 256 + text[1:]
    joint = np.bincount(pairs, minlength=256 * 256) / len(pairs)
    first = joint.reshape(256, 256).sum(1)
    want = -(joint[joint > 0] * np.log2(joint[joint > 0])).sum() + (first[first > 0] * np.log2(first[first > 0])).sum()
    for chunk in (1, 2, 7, len(text) - 2, len(text) - 1, len(text), 2**24):
        assert bigram_entropy_bits(text, chunk=chunk) == pytest.approx(want, rel=1e-12)


def _anon_rss() -> int:
    """Anonymous resident memory of this process (a copy of the text would land here, a mapped file does not)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssAnon in /proc/self/status")


def test_the_loader_reads_the_map_without_copying_the_text(tmp_path):
    """(c) by memory: streaming 20 steps of a 128 MiB mapped text adds far less than the text to the
    process's anonymous memory (a loader that copied the text, even once, would add all of it)."""
    import grain  # noqa: F401  (imported before the baseline: its import allocates)

    path = tmp_path / "text.u8"
    with open(path, "wb") as f:
        f.truncate(128 * 2**20)  # sparse: no disk written, the map reads zero pages
    text = np.memmap(path, np.uint8, mode="r")
    host_starts(KEYS_S2, 0, 8, len(text) - 32)  # compile the offsets program before the baseline
    before = _anon_rss()
    stream = HostStream(text, 33, KEYS_S2, 8, start=0, stop=20)
    got = [stream.next().windows for _ in range(20)]
    assert len(got) == 20 and got[-1].shape == (2, 8, 33)
    assert _anon_rss() - before < 16 * 2**20 < len(text)
