"""task.bos of the lm task: documents packed with a beginning of sequence, every window opened by it, bits per byte over
bytes only, and task.bos=false the windows of before, bit for bit."""

from __future__ import annotations

import functools
import hashlib
import math

import jax
import numpy as np
import pytest
from cli_helpers import TINY, metrics, tiny_task, train_in_process

from attnlab import config
from attnlab.tasks.lm import corpus
from attnlab.tasks.lm.host_stream import BOS, BOS_SYMBOL, BosTextWindows, TextWindows

SMALL = {"seq_len": 32, "n_train": 300, "n_val": 60, "n_test": 60}
LONG = {"seq_len": 256, "n_val": 500, "n_test": 500}  # windows long and many enough to hold document starts


@functools.lru_cache(maxsize=None)
def lm(**options):
    return config.task("lm", **{**SMALL, **options})


def digest(task) -> str:
    """sha256 of every split array (dtype, shape, bytes) and of each split's text."""
    h = hashlib.sha256()
    for s in ("train", "val", "test"):
        for f in ("inputs", "targets", "weights", "valid"):
            a = np.ascontiguousarray(getattr(task.splits[s], f))
            h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    for s in ("train", "val", "test"):
        h.update(np.asarray(task.text[s]).tobytes())
    return h.hexdigest()


# The digests of the lm task's arrays before task.bos existed (attnlab 782d799), computed with that code.
BEFORE_BOS = {
    "defaults": "99ab74ca0ca03ee04704bac6b2ab0a42f46f44129beb29eec0f1433da8e4233d",
    "seq_len=16 n=200/40/40 seed=3": "89d1b0965156924e147e866076e1e7016a2a14a21f524c971a51a6f0c97e61c0",
}


@pytest.mark.parametrize("bos", [None, False])
def test_bos_false_gives_the_arrays_of_before_bit_for_bit(bos):
    extra = {} if bos is None else {"bos": bos}
    assert digest(config.task("lm", **extra)) == BEFORE_BOS["defaults"]
    small = config.task("lm", seq_len=16, n_train=200, n_val=40, n_test=40, seed=3, **extra)
    assert digest(small) == BEFORE_BOS["seq_len=16 n=200/40/40 seed=3"]
    assert small.vocab_size == 257 and small.num_classes == 256
    batches = small.batches(8)
    assert type(batches) is TextWindows and batches.text.dtype == np.uint8


def test_every_example_starts_with_bos():
    task = lm(bos=True)
    assert task.vocab_size == 258 and task.num_classes == 256 and BOS == 257
    for s, split in task.splits.items():
        assert (split.inputs[:, 0] == BOS).all(), s
        assert split.inputs.max() <= BOS and split.inputs.min() >= 1 and split.valid.all()
    (at,) = config.task("lm", **SMALL, bos=True, test_lengths=[64]).at_lengths.values()
    assert at.seq_len == 64 and (at.splits["test"].inputs[:, 0] == BOS).all()


def test_bos_opens_every_document_of_the_packed_stream():
    task = lm(bos=True)
    docs, _ = corpus.pydoc_topics()
    for s, idx in task.documents.items():
        stream = task.stream[s]
        assert stream.dtype == np.uint16
        starts = np.cumsum([0] + [len(docs[i]) + 1 for i in idx[:-1]])
        np.testing.assert_array_equal(np.flatnonzero(stream == BOS_SYMBOL), starts)
        assert stream[stream != BOS_SYMBOL].astype(np.uint8).tobytes() == b"".join(docs[i] for i in idx)
        # The plain text (baselines, bits per byte) is unchanged: the documents joined as without bos.
        assert task.text[s].tobytes() == corpus.SEPARATOR.join(docs[i] for i in idx)
    assert task.baseline("test")["bits_per_byte"] == lm().baseline("test")["bits_per_byte"]


def test_windows_are_pieces_of_the_stream_and_bos_targets_weigh_nothing():
    task = lm(bos=True, **LONG)
    for s, split in task.splits.items():
        stream = task.stream[s].astype(np.int64)
        inside = split.inputs[:, 1:] == BOS  # a document start inside a window
        assert inside.any(), s
        target_bos = split.weights == 0
        # A BOS input at t + 1 is the target of t: a placeholder 0 of weight 0; every other target weighs 1.
        np.testing.assert_array_equal(target_bos[:, :-1], inside)
        assert (split.targets[target_bos] == 0).all() and (split.weights[~target_bos] == 1).all()
        for row_in, row_t, w in zip(split.inputs[:20], split.targets[:20], split.weights[:20]):
            symbols = np.where(w > 0, row_t, BOS_SYMBOL)  # the window's symbols 1..T
            np.testing.assert_array_equal(row_in[1:] - 1, symbols[:-1])
            hits = np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(stream, len(symbols)) == symbols, 1))
            assert len(hits) and (hits >= 1).all()


def test_bits_per_byte_count_bytes_only():
    """A uniform predictor over the 256 bytes is 8 bits per byte, however many BOS targets a split holds; through
    the head's own metrics and the task's derived metrics."""
    from attnlab.heads.classification import SoftmaxCE

    task = lm(bos=True, **LONG)
    split = task.splits["val"]
    assert (split.weights == 0).sum() > 0
    from flax import nnx

    head = SoftmaxCE(d_model=4, num_classes=256, rngs=nnx.Rngs(0))
    logits = np.zeros((*split.targets.shape, 256), np.float32)
    # Whatever the predictor says at a BOS target must not count: make it very wrong there.
    logits[split.weights == 0, 5] = 50.0
    sums = head.metric_sums(logits.reshape(-1, 256), split.targets.ravel(), split.weights.ravel())
    nll = float(sums["nll"] / sums["weight"])
    assert float(sums["weight"]) == split.weights.sum() < split.weights.size
    assert task.derived_metrics({"nll": nll}, "val")["bits_per_byte"] == pytest.approx(8.0, rel=1e-6)


def test_training_windows_open_with_bos():
    task = lm(bos=True)
    batches = task.batches(16)
    assert type(batches) is BosTextWindows and batches.text.dtype == np.uint16
    batches = jax.device_put(batches)  # as the trainer places resident data
    batch = jax.jit(lambda k: batches.draw(k, 64))(jax.random.key(0))
    inputs, targets, weights = (np.asarray(batch[k]) for k in ("inputs", "targets", "weights"))
    assert inputs.shape == targets.shape == (64, SMALL["seq_len"])
    assert (inputs[:, 0] == BOS).all()
    np.testing.assert_array_equal(weights[:, :-1] == 0, inputs[:, 1:] == BOS)
    assert (targets[weights == 0] == 0).all()
    byte = (weights[:, :-1] > 0) & (inputs[:, 1:] != BOS)
    np.testing.assert_array_equal((inputs[:, 1:] - 1)[byte], targets[:, :-1][byte])


def test_bos_options_are_checked():
    with pytest.raises(ValueError, match="task.bos"):
        config.task("lm", **SMALL, bos="yes")
    with pytest.raises(ValueError, match="device_text_bytes"):
        config.task("lm", **SMALL, bos=True, device_text_bytes=1000)


def test_a_short_run_with_bos_reports_bits_per_byte(tmp_path):
    run_dir = tmp_path / "run"
    train_in_process(*TINY, "task=lm", *tiny_task("lm"), "task.bos=true", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    final = metrics(run_dir)["final"]
    assert math.isfinite(final["test/bits_per_byte"])
    assert final["test/bits_per_byte"] == pytest.approx(final["test/nll"] / math.log(2), rel=1e-6)
