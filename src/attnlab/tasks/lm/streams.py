"""How the lm corpus becomes the streams a split's windows are cut from: documents to splits, each split's documents
packed under task.bos, and the entropies counted on a stream (the task's baselines)."""

from __future__ import annotations

import numpy as np

from attnlab.checks import ConfigError
from attnlab.tasks.base import SPLITS, Split
from attnlab.tasks.lm.host_stream import bos_batch_arrays


def entropy_bits(counts: np.ndarray) -> float:
    """H in bits of the distribution proportional to `counts`."""
    p = counts[counts > 0] / max(counts.sum(), 1)
    return float(-(p * np.log2(p)).sum())


def unigram_entropy_bits(text_N: np.ndarray, num_symbols: int = 256) -> float:
    """H(X) in bits of the symbol distribution of `text` (bytes, or token ids below num_symbols)."""
    return entropy_bits(np.bincount(text_N, minlength=num_symbols))


def bigram_entropy_bits(text_U8: np.ndarray, chunk: int = 2**24) -> float:
    """H(X_t | X_{t−1}) = H(X_{t−1}, X_t) − H(X_{t−1}) in bits, over the consecutive byte pairs of `text`."""
    joint = np.zeros(256 * 256)
    for lo in range(0, max(len(text_U8) - 1, 0), chunk):  # chunks: int64 pairs of a whole corpus are 8× its size
        part = np.asarray(text_U8[lo : lo + chunk + 1])
        joint += np.bincount(part[:-1].astype(np.int64) * 256 + part[1:], minlength=256 * 256)
    return entropy_bits(joint) - entropy_bits(joint.reshape(256, 256).sum(1))


def symbol_dtype(bos_symbol: int):
    """The stream's dtype: uint16 while the symbols up to bos_symbol fit, else int32."""
    return np.uint16 if bos_symbol < 2**16 else np.int32


def packed(docs: list[np.ndarray], bos_symbol: int) -> np.ndarray:
    """task.bos: the documents' tokens back to back, each opened by bos_symbol (symbol_dtype)."""
    out = np.empty(sum(len(d) + 1 for d in docs), symbol_dtype(bos_symbol))
    at = 0
    for d in docs:
        out[at] = bos_symbol
        out[at + 1 : at + 1 + len(d)] = d
        at += len(d) + 1
    return out


def bos_split(windows_NW: np.ndarray, bos_symbol: int) -> Split:
    """task.bos: a split of windows of seq_len + 1 symbols (bos_batch_arrays, in numpy)."""
    return Split(*(np.asarray(a) for a in bos_batch_arrays(windows_NW.astype(np.int32), np, bos_symbol)))


def split_documents(docs: list[bytes], fractions: dict[str, float], rng) -> dict[str, np.ndarray]:
    """Document indices per split: a seeded permutation fills test, then val, up to their byte fractions."""
    if len(docs) < 3:
        raise ConfigError(f"the corpus has {len(docs)} document(s); splitting by document needs at least 3")
    order = rng.permutation(len(docs))
    sizes = np.array([len(docs[i]) for i in order])
    total, out, start = sizes.sum(), {}, 0
    for s in ("test", "val"):
        # At least one document each, and leave at least one for the later splits.
        need = fractions[s] * total
        stop = start + 1
        while stop < len(docs) - (2 if s == "test" else 1) and sizes[start:stop].sum() < need:
            stop += 1
        out[s], start = np.sort(order[start:stop]), stop
    out["train"] = np.sort(order[start:])
    return {s: out[s] for s in SPLITS}
