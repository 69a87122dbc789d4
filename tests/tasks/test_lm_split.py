"""The lm task on one long text without paragraphs (nanoGPT-style): contiguous byte ranges train | val | test."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import config

SMALL = {"seq_len": 16, "n_train": 100, "n_val": 20, "n_test": 20}


@pytest.mark.parametrize("paragraphs", [1, 2])
def test_fewer_than_3_documents_split_by_contiguous_byte_ranges(tmp_path, paragraphs):
    rng = np.random.default_rng(0)
    words = ["to", "be", "or", "not", "that", "is", "the", "question"]
    text = "\n\n".join(" ".join(rng.choice(words, 400)) for _ in range(paragraphs)).encode()
    f = tmp_path / "input.txt"
    f.write_bytes(text)
    lm = config.task("lm", path=str(f), val_fraction=0.1, test_fraction=0.2, **SMALL)
    assert lm.corpus["split"] == "contiguous byte ranges (train | val | test)"
    got = {s: lm.text[s].tobytes() for s in ("train", "val", "test")}
    assert got["train"] + got["val"] + got["test"] == text  # in order, nothing dropped or repeated
    n = len(text)
    assert len(got["train"]) == round(0.7 * n) and len(got["test"]) == n - round(0.8 * n)
    assert lm.corpus["split_bytes"] == {s: len(t) for s, t in got.items()}
    for s in ("train", "val", "test"):  # every window comes from its own range
        for row in lm.splits[s].inputs[:10]:
            assert bytes((row - 1).astype(np.uint8).tolist()) in got[s]


def test_three_or_more_documents_still_split_by_document(tmp_path):
    f = tmp_path / "paras.txt"
    f.write_text("\n\n".join(f"paragraph {i} " * 10 for i in range(6)))
    assert config.task("lm", path=str(f), **SMALL).corpus["split"] == "by document"
