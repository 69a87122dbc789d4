"""The lm task's subword tokens: the BPE's round trip and cache, streams and windows of token ids, tokens per byte,
baselines counted again from Hugging Face's own encoding, bits per byte, the identity in run.json, refusals."""

from __future__ import annotations

import collections
import hashlib
import json
import math

import numpy as np
import pytest
from cli_helpers import TINY, events, metrics, train_in_process
from tensorboard.plugins.hparams import metadata

from attnlab import config
from attnlab.checks import ConfigError
from attnlab.tasks.lm import corpus

SMALL = {"seq_len": 32, "n_train": 200, "n_val": 60, "n_test": 60, "bpe_vocab_size": 512}


@pytest.fixture(scope="module")
def bpe():
    return config.task("lm", tokenizer="bpe", **SMALL)


@pytest.fixture(scope="module")
def bpe_bos():
    return config.task("lm", tokenizer="bpe", bos=True, **SMALL)


def test_each_split_stream_decodes_to_its_text(bpe):
    assert bpe.num_classes == 512 and bpe.vocab_size == 513
    for s, text in bpe.text.items():
        stream = bpe.stream[s]
        assert stream.dtype == np.uint16 and stream.max() < 512
        assert bpe.subwords.decode(stream).encode() == text.tobytes()
        assert bpe.tokens_per_byte[s] == len(stream) / len(text) < 0.5  # a BPE of 512 ids merges bytes


def test_windows_are_stream_pieces_with_next_token_targets(bpe):
    for s, split in bpe.splits.items():
        np.testing.assert_array_equal(split.inputs[:, 1:] - 1, split.targets[:, :-1])
        assert split.inputs.min() >= 1 and split.targets.max() < 512 and (split.weights == 1).all()
        stream = bpe.stream[s].astype(np.int64).tobytes()
        for row, target in zip(split.inputs[:10], split.targets[:10]):
            window = np.concatenate([row - 1, target[-1:]]).astype(np.int64)
            assert window.tobytes() in stream  # (int64 rows: a match is at a token boundary or at none)


def test_bos_opens_every_document_of_the_packed_tokens(bpe_bos):
    docs, _ = corpus.pydoc_topics()
    task = bpe_bos
    assert task.vocab_size == 514 and task.bos_symbol == 512
    for s, idx in task.documents.items():
        stream = task.stream[s]
        starts = np.flatnonzero(stream == 512)
        assert len(starts) == len(idx) and starts[0] == 0
        pieces = np.split(stream, starts[1:])
        assert [task.subwords.decode(p[1:]).encode() for p in pieces] == [docs[i] for i in idx]
        per_byte = (len(stream) - len(idx)) / sum(len(docs[i]) for i in idx)
        assert task.tokens_per_byte[s] == pytest.approx(per_byte, rel=1e-12)
    split = task.splits["val"]
    assert (split.inputs[:, 0] == 513).all()
    np.testing.assert_array_equal(split.weights[:, :-1] == 0, split.inputs[:, 1:] == 513)


def test_unigram_baseline_counts_huggingface_encoding_again(bpe):
    """The baseline from the tokens the tokenizer itself gives for the training text (its paragraphs), converted with
    the bytes that text holds."""
    text = bpe.text["train"].tobytes()
    ids = [i for p in text.split(b"\n\n") for i in bpe.subwords.hf.encode(p.decode()).ids]
    ids += bpe.subwords.hf.encode("\n\n").ids * (text.count(b"\n\n"))
    counts = collections.Counter(ids)
    n = sum(counts.values())
    unigram_bits_per_token = -sum(c / n * math.log2(c / n) for c in counts.values())
    base = bpe.baseline("test")
    assert base["bits_per_byte"] == pytest.approx(unigram_bits_per_token * n / len(text), rel=1e-9)
    assert "bits_per_byte_bigram" not in base and set(bpe.plateaus()["test/bits_per_byte"]) == {"unigram"}
    majority = counts.most_common(1)[0][0]
    assert base["accuracy"] == pytest.approx(np.mean(bpe.splits["test"].targets == majority))


def test_bits_per_byte_uses_each_split_tokens_per_byte(bpe):
    """nll nats per token -> bits per token, times the split's tokens per byte; test lengths are the test split's."""
    for split in ("val", "test", "test_len/128"):
        got = bpe.derived_metrics({"nll": 2.0}, split)
        ratio = bpe.tokens_per_byte["val" if split == "val" else "test"]
        assert got["bits_per_token"] == pytest.approx(2.0 / math.log(2))
        assert got["bits_per_byte"] == pytest.approx(2.0 / math.log(2) * ratio)
        assert got["perplexity"] == pytest.approx(math.exp(2.0))


def test_the_bpe_is_trained_once_and_deterministically(tmp_path, monkeypatch, bpe):
    """A fresh cache trains the same merges again (the identity's hash); a second task loads the cached file."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    first = config.task("lm", tokenizer="bpe", **SMALL)
    ident = first.corpus["tokenizer"]
    assert ident["merges_sha256"] == bpe.corpus["tokenizer"]["merges_sha256"]
    assert ident["file"].startswith(str(tmp_path)) and ident["vocab_size"] == 512
    merges = json.loads(open(ident["file"]).read())["model"]["merges"]
    assert hashlib.sha256(json.dumps(merges).encode()).hexdigest() == ident["merges_sha256"]
    mtime = (tmp_path / ident["file"]).stat().st_mtime_ns
    again = config.task("lm", tokenizer="bpe", **SMALL)
    assert again.corpus["tokenizer"] == ident and (tmp_path / ident["file"]).stat().st_mtime_ns == mtime
    other = config.task("lm", tokenizer="bpe", **{**SMALL, "bpe_vocab_size": 600})
    assert other.corpus["tokenizer"]["file"] != ident["file"] and other.num_classes == 600


def test_a_tokenizer_json_file_gives_the_same_tokens(tmp_path, bpe):
    path = tmp_path / "tokenizer.json"
    bpe.subwords.hf.save(str(path))
    task = config.task("lm", tokenizer=str(path), **SMALL)
    ident = task.corpus["tokenizer"]
    assert ident == {"kind": "file", "path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    for s in bpe.stream:
        np.testing.assert_array_equal(task.stream[s], bpe.stream[s])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tokenizer": "no/such/tokenizer.json"}, "no such file"),
        ({"tokenizer": ""}, "allowed: bytes, bpe, or the path of a tokenizer.json"),
        ({"tokenizer": "bpe", "bpe_vocab_size": 100}, "task.bpe_vocab_size=100"),
        ({"tokenizer": "bpe", "bpe_vocab_size": 70000}, "task.bpe_vocab_size=70000"),
        ({"tokenizer": "bpe", "device_text_bytes": 1000}, "task.tokenizer=bpe keep the training text on the device"),
        ({"tokenizer": "bpe", "seq_len": 30000}, "tokens"),
    ],
)
def test_bad_tokenizer_options_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        config.task("lm", **{**SMALL, **options})


def test_a_bpe_run_records_its_tokenizer_and_bits_per_byte(tmp_path):
    out = tmp_path / "run"
    train_in_process(
        *TINY,
        "task=lm",
        "task.tokenizer=bpe",
        "task.bpe_vocab_size=512",
        "task.seq_len=16",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    run = json.loads((out / "run.json").read_text())
    ident, per_byte = run["corpus"]["tokenizer"], run["corpus"]["tokens_per_byte"]
    assert ident["kind"] == "bpe" and ident["vocab_size"] == 512 and len(ident["merges_sha256"]) == 64
    final = metrics(out)["final"]
    assert final["test/bits_per_token"] == pytest.approx(final["test/nll"] / math.log(2), rel=1e-6)
    assert final["test/bits_per_byte"] == pytest.approx(final["test/bits_per_token"] * per_byte["test"], rel=1e-6)
    board = events(out)  # TensorBoard's own reader: the curves per token and per byte, both columns of the HParams tab
    val = {t: board.Scalars(t)[-1].value for t in ("val/bits_per_token", "val/bits_per_byte")}
    assert val["val/bits_per_byte"] == pytest.approx(val["val/bits_per_token"] * per_byte["val"], rel=1e-5)
    hparams = board.PluginTagToContent("hparams")
    experiment = metadata.parse_experiment_plugin_data(hparams[metadata.EXPERIMENT_TAG])
    assert {"test/bits_per_byte", "test/bits_per_token"} <= {m.name.tag for m in experiment.metric_infos}
