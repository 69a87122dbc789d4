"""The lm task: document split, windows, baselines against direct counts, user text, datasets' text loader."""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import pytest
from cli_helpers import TINY, metrics, tiny_task, train_in_process

from attnlab import config
from attnlab.tasks.lm import corpus

SMALL = {"seq_len": 32, "n_train": 300, "n_val": 60, "n_test": 60}


@pytest.fixture(scope="module")
def lm():
    return config.task("lm", **SMALL)


def test_split_is_by_document_with_no_overlap(lm):
    docs, ident = corpus.pydoc_topics()
    idx = {s: set(v.tolist()) for s, v in lm.documents.items()}
    assert not idx["train"] & idx["val"] and not idx["train"] & idx["test"] and not idx["val"] & idx["test"]
    assert idx["train"] | idx["val"] | idx["test"] == set(range(len(docs))) == set(range(ident["documents"]))
    for s, text in lm.text.items():
        assert text.tobytes() == b"\n\n".join(docs[i] for i in sorted(idx[s]))
        # Every window of a split is a piece of that split's own text.
        for row in lm.splits[s].inputs[:20]:
            assert bytes((row - 1).astype(np.uint8).tolist()) in text.tobytes()
    total = sum(len(d) for d in docs)
    assert ident["bytes"] == total and 0.1 * total <= len(lm.text["test"]) and 0.1 * total <= len(lm.text["val"])


def test_targets_are_the_next_byte_and_decode_inverts_the_inputs(lm):
    s = lm.splits["train"]
    np.testing.assert_array_equal(s.inputs[:, 1:] - 1, s.targets[:, :-1])
    assert s.inputs.min() >= 1 and s.targets.max() <= 255 and lm.vocab_size == 257 and lm.num_classes == 256
    row = s.inputs[0]
    assert lm.decode(row).encode() == bytes((row - 1).tolist()) or "\ufffd" in lm.decode(row)
    assert lm.decode(np.array([ord("h") + 1, ord("i") + 1, 0, 0])) == "hi"


def test_baselines_equal_entropies_counted_directly(lm):
    text = lm.text["train"].tobytes()
    n = len(text)
    unigram = -sum(c / n * math.log2(c / n) for c in collections.Counter(text).values())
    pairs = collections.Counter(zip(text[:-1], text[1:]))
    firsts = collections.Counter(text[:-1])
    bigram = -sum(c / (n - 1) * math.log2(c / firsts[a]) for (a, _), c in pairs.items())
    base = lm.baseline("test")
    assert base["bits_per_byte"] == pytest.approx(unigram, rel=1e-9)
    assert base["bits_per_byte_bigram"] == pytest.approx(bigram, rel=1e-9)
    majority = collections.Counter(text).most_common(1)[0][0]
    assert base["accuracy"] == pytest.approx(np.mean(lm.splits["test"].targets == majority))


def test_derived_metrics_are_nll_in_bits_and_its_exponential(lm):
    got = lm.derived_metrics({"nll": 2.0, "accuracy": 0.5}, "test")
    assert got == {"bits_per_byte": pytest.approx(2.0 / math.log(2)), "perplexity": pytest.approx(math.exp(2.0))}


def write_docs(root, n=4):
    root.mkdir()
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "omega"]
    for i in range(n):
        (root / f"doc{i}.txt").write_text(" ".join(rng.choice(words, 200)) + "\n")
    return root


def test_user_directory_glob_and_single_file(tmp_path):
    root = write_docs(tmp_path / "texts")
    by_dir = config.task("lm", path=str(root), **SMALL)
    by_glob = config.task("lm", path=str(root / "*.txt"), **SMALL)
    assert by_dir.corpus["documents"] == by_glob.corpus["documents"] == 4
    assert by_dir.corpus["sha256"] == by_glob.corpus["sha256"]
    one = tmp_path / "one.txt"
    one.write_text("\n\n".join(f"paragraph {i} " * 10 for i in range(6)))
    single = config.task("lm", path=str(one), **{**SMALL, "seq_len": 16})
    assert single.corpus["documents"] == 6  # one file: its paragraphs are the documents
    with pytest.raises(ValueError, match=r"task.path='.*nothing\*' matches no file"):
        config.task("lm", path=str(tmp_path / "nothing*"), **SMALL)


def test_datasets_text_loader_works_offline(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    lines = [f"line {i}: " + "the quick brown fox jumps over the lazy dog " * 2 for i in range(12)]
    f = tmp_path / "notes.txt"
    f.write_text("\n".join(lines) + "\n\n")
    task = config.task("lm", hf_dataset="text", hf_data_files=str(f), **{**SMALL, "seq_len": 16})
    assert task.corpus["documents"] == 12 and task.corpus["source"] == "hf:text"
    assert task.corpus["bytes"] == sum(len(x.encode()) for x in lines)
    with pytest.raises(ValueError, match="task.hf_column='body' is not a column"):
        config.task("lm", hf_dataset="text", hf_data_files=str(f), hf_column="body", **SMALL)


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"path": "x", "hf_dataset": "y"}, "exclude each other"),
        ({"path": ""}, "task.path='' is invalid"),
        ({"seq_len": 1}, "task.seq_len=1 is invalid"),
        ({"val_fraction": 0.7}, "task.val_fraction=0.7 is invalid"),
        ({"seq_len": 60000}, "fewer than task.seq_len + 1"),
        ({"n_val": "many"}, "task.n_val='many' is invalid; allowed: auto or an integer >= 1"),
        ({"n_test": 0}, "task.n_test=0 is invalid; allowed: auto or an integer >= 1"),
        ({"corpus": "wikitext"}, "task.corpus='wikitext' is invalid; allowed: pydoc_topics, python_stdlib"),
        ({"corpus": "python_stdlib", "path": "x"}, "task.corpus=python_stdlib and task.path='x' exclude each other"),
    ],
)
def test_bad_options_fail_in_one_line(options, needle):
    with pytest.raises(ValueError) as e:
        config.task("lm", **{**SMALL, **options})
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_cli_run_on_a_user_file_records_corpus_and_bits_per_byte(tmp_path):
    root = write_docs(tmp_path / "texts")
    run_dir = tmp_path / "run"
    train_in_process(
        *TINY,
        "task=lm",
        *tiny_task("lm"),
        f"task.path={root}",
        "model.positional=rope",
        "trainer.vmap_seeds=2",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    for seed in (0, 1):
        d = run_dir / f"seed{seed}"
        run = json.loads((d / "run.json").read_text())
        assert run["corpus"]["documents"] == 4 and run["corpus"]["source"] == f"path:{root}"
        m = metrics(d)
        assert m["status"] == "completed"
        nll = m["final"]["test/nll"]
        assert m["final"]["test/bits_per_byte"] == pytest.approx(nll / math.log(2), rel=1e-6)
        assert m["final"]["test/perplexity"] == pytest.approx(math.exp(nll), rel=1e-6)
        assert {"baseline/bits_per_byte", "baseline/bits_per_byte_bigram"} <= set(m["baseline"])


def _stream_windows(lm, seed: int, steps, batch: int = 8) -> np.ndarray:
    """The training windows (bytes) of the given steps, as the train step draws them."""
    import jax

    from attnlab.steps import sample_batch, step_key

    data = jax.device_put(lm.batches(batch))
    key = jax.random.key_data(jax.random.key(seed))
    draw = jax.jit(jax.vmap(lambda s: sample_batch(data, step_key({"key": key, "step": s}), batch)))
    b = draw(jax.numpy.asarray(np.asarray(steps, np.int32)))
    np.testing.assert_array_equal(np.asarray(b["inputs"])[..., 1:] - 1, np.asarray(b["targets"])[..., :-1])
    return np.concatenate([np.asarray(b["inputs"]) - 1, np.asarray(b["targets"])[..., -1:]], -1).reshape(-1, 33)


def test_training_windows_come_from_the_whole_text_and_replay_by_seed_and_step(lm):
    text = lm.text["train"].tobytes()
    windows = _stream_windows(lm, 0, range(2000))
    starts = np.array([text.find(bytes(w.astype(np.uint8).tolist())) for w in windows])
    assert (starts >= 0).all(), "a window that is not a piece of the training text"
    # Offsets spread over the whole text: every decile holds windows (not exactly a tenth each: `find`
    # gives the first occurrence of a repeated passage, moving some windows to an earlier decile).
    counts = np.bincount(np.minimum(10 * starts // (len(text) - 32), 9), minlength=10)
    assert counts.min() > 0.04 * len(starts), counts
    assert len({w.tobytes() for w in windows}) > 10 * SMALL["n_train"]  # not a fixed pre-sampled set
    np.testing.assert_array_equal(_stream_windows(lm, 0, [5, 7]), windows[np.r_[40:48, 56:64]])  # resume replays
    assert not np.array_equal(_stream_windows(lm, 1, [5]), windows[40:48])


def test_device_training_data_is_the_text_whatever_n_train():
    import jax

    from attnlab.accelerator import data_mesh
    from attnlab.train import train_data
    from attnlab.train.state import Placement

    placement = Placement.of(data_mesh(), 1)
    few, many = (train_data(config.task("lm", **{**SMALL, "n_train": n}), placement) for n in (10, 1000))
    assert jax.tree.map(lambda a: (a.shape, a.dtype), few) == jax.tree.map(lambda a: (a.shape, a.dtype), many)
    lm = config.task("lm", **SMALL)
    assert few.text.dtype == np.uint8 and few.text.nbytes == len(lm.text["train"])
    assert sum(a.nbytes for a in jax.tree.leaves(few)) == len(lm.text["train"]) + 4 * (SMALL["seq_len"] + 1)


@pytest.mark.parametrize("seq_len", [64, 100, 1024])
def test_auto_eval_windows_hold_the_same_bytes_at_any_seq_len(seq_len):
    """n_val/n_test=auto: ceil(32000 / seq_len) windows (500 at the default 64), so evaluation cost is fixed."""
    lm = config.task("lm", seq_len=seq_len, n_train=10)
    expected = math.ceil(32000 / seq_len)
    for s in ("val", "test"):
        assert lm.splits[s].inputs.shape == (expected, seq_len) and lm.splits[s].weights.sum() >= 32000
    assert lm.splits["train"].inputs.shape[0] == 10
    assert config.task("lm", seq_len=1024, n_train=10, n_val=7).splits["val"].inputs.shape[0] == 7


def test_default_corpus_is_the_pinned_pydoc_topics_under_every_python():
    """The shipped text is CPython 3.11.7's topics, by content: its hash is the pinned one (on 3.11.7 it is
    what pydoc_data holds; on 3.12.1 pydoc_data differs and the corpus does not)."""
    import hashlib
    import platform

    docs, ident = corpus.pydoc_topics()
    joined = b"\n\n".join(docs)
    assert hashlib.sha256(joined).hexdigest() == corpus.PYDOC_TOPICS_SHA256 == ident["sha256"]
    assert ident["bytes"] == sum(map(len, docs)) == 466117 and ident["documents"] == 79 and ident["python"] == "3.11.7"
    if platform.python_version() == "3.11.7":
        from pydoc_data.topics import topics

        assert docs == [topics[n].encode("utf-8") for n in sorted(topics)]


def test_a_damaged_default_corpus_is_refused(tmp_path):
    import gzip

    payload = json.loads(gzip.decompress(corpus.PYDOC_TOPICS.read_bytes()))
    name = sorted(payload["topics"])[0]
    payload["topics"][name] = payload["topics"][name].replace("e", "E", 1)
    damaged = tmp_path / "pydoc_topics.json.gz"
    damaged.write_bytes(gzip.compress(json.dumps(payload).encode()))
    with pytest.raises(RuntimeError, match="has sha256 .*not the pinned .*reinstall attnlab"):
        corpus.pydoc_topics(damaged)


def test_the_stdlib_corpus_is_the_pinned_standard_library_source_one_document_per_file():
    """CPython 3.11.7's standard library source as scripts/ship_stdlib_corpus.py selects it, by content: on 3.11.7
    each document is the file of that name in the running interpreter's standard library."""
    import lzma
    import platform
    import sysconfig
    from pathlib import Path

    from attnlab.options import tasks as task_options

    docs, ident = corpus.python_stdlib()
    assert ident["sha256"] == corpus.PYTHON_STDLIB_SHA256 and ident["python"] == "3.11.7"
    assert ident["bytes"] == sum(map(len, docs)) == 9_656_259 and ident["documents"] == len(docs) == 536
    assert tuple(corpus.SHIPPED) == task_options.CORPORA
    names = sorted(json.loads(lzma.decompress(corpus.PYTHON_STDLIB.read_bytes()))["files"])
    assert not any(part in ("test", "tests", "encodings", "site-packages") for n in names for part in n.split("/"))
    if platform.python_version() == "3.11.7":
        root = Path(sysconfig.get_paths()["stdlib"])
        assert docs == [(root / n).read_bytes() for n in names]


def test_a_damaged_stdlib_corpus_is_refused(tmp_path):
    import lzma

    payload = json.loads(lzma.decompress(corpus.PYTHON_STDLIB.read_bytes()))
    name = sorted(payload["files"])[0]
    payload["files"][name] += "#"
    damaged = tmp_path / "python_stdlib.json.xz"
    damaged.write_bytes(lzma.compress(json.dumps(payload).encode(), preset=0))  # the fastest: only its content counts
    with pytest.raises(RuntimeError, match="has sha256 .*not the pinned .*reinstall attnlab"):
        corpus.python_stdlib(damaged)


def test_a_run_that_repeats_its_training_text_says_how_often(lm):
    """run.json's corpus.train_tokens is the training stream's length; the summary names the passes a run made over
    it (steps × batch × seq_len per seed / train_tokens) when above one, and nothing at one or below."""
    from attnlab.run.summary import passes_over_text

    tokens = lm.corpus["train_tokens"]
    assert tokens == len(lm.stream["train"]) == len(lm.text["train"])  # bytes: one token per byte, no BOS
    run = {"corpus": {"train_tokens": tokens}, "config": {"trainer": {"batch_size": 8}, "task": {"seq_len": 32}}}
    steps = math.ceil(3 * tokens / (8 * 32))
    assert passes_over_text({"steps": steps}, run) == (
        f"{steps * 8 * 32 / tokens:.3g} passes over the training text ({tokens:,} tokens)"
    )
    assert passes_over_text({"steps": tokens // (8 * 32)}, run) is None
    assert passes_over_text({"steps": steps}, {**run, "corpus": {}}) is None  # not a language model
