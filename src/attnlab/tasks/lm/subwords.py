"""The lm task's subword tokens (task.tokenizer): a byte-level BPE trained on the training split with Hugging Face
`tokenizers`, cached under its identity, or a tokenizer.json (a file, or a hub name where the hub is reachable).

The BPE is GPT-2's construction (Radford et al. 2019; `tokenizers`' ByteLevel pre-tokenizer): its base alphabet is
the 256 bytes, so every text encodes without an unknown token, and a document's tokens decode to its bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from attnlab.checks import ConfigError
from attnlab.tasks.lm import text_cache

BYTES, BPE = "bytes", "bpe"
# The BPE's settings beside its vocabulary size: part of its identity (run.json) and of its cache file's name.
BPE_SETTINGS = {"model": "BPE", "pre_tokenizer": "ByteLevel(add_prefix_space=false)", "special_tokens": []}


@dataclasses.dataclass(frozen=True)
class Subwords:
    """A Hugging Face tokenizer and its identity (run.json's corpus.tokenizer); ids are in [0, vocab_size)."""

    hf: Tokenizer
    identity: dict

    @property
    def vocab_size(self) -> int:
        return int(self.hf.get_vocab_size(with_added_tokens=True))

    def encode(self, texts: list[bytes]) -> list[np.ndarray]:
        """Each text's token ids (UTF-8; an invalid byte reads as U+FFFD), without the tokenizer's special tokens."""
        strings = [t.decode("utf-8", errors="replace") for t in texts]
        return [np.asarray(e.ids, np.int64) for e in self.hf.encode_batch(strings, add_special_tokens=False)]

    def encode_documents(self, docs: list[bytes], separator: bytes) -> list[np.ndarray]:
        """Each document's tokens: its paragraphs (split at `separator`) encoded in one parallel batch and joined by
        the separator's tokens, so no string handed to the tokenizer is a whole long text."""
        paragraphs = [d.split(separator) for d in docs]
        flat = self.encode([p for ps in paragraphs for p in ps] + [separator])
        sep_K, out, at = flat.pop(), [], 0
        for ps in paragraphs:
            parts = flat[at : at + len(ps)]
            at += len(ps)
            joined = [piece for part in parts for piece in (sep_K, part)][1:]
            out.append(np.concatenate(joined) if joined else np.zeros(0, np.int64))
        return out

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)


def load(spec: str, vocab_size: int, train_docs: list[bytes]) -> Subwords:
    """task.tokenizer=bpe: trained_bpe on the training documents; otherwise a tokenizer.json file or hub name."""
    if spec == BPE:
        return trained_bpe(train_docs, vocab_size)
    path = Path(spec).expanduser()
    if path.is_file():
        try:
            hf = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
            raise ConfigError(f"task.tokenizer={spec!r}: not a tokenizer.json ({exc})") from None
        return Subwords(
            hf, {"kind": "file", "path": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        )
    if spec.endswith(".json") or spec.startswith((".", "/", "~")) or spec.count("/") > 1:  # a path, not "owner/name"
        raise ConfigError(f"task.tokenizer={spec!r}: no such file; allowed: bytes, bpe, a tokenizer.json, a hub name")
    try:
        hf = Tokenizer.from_pretrained(spec)
    except Exception as exc:  # offline or an unknown name: tokenizers raises a bare Exception
        raise ConfigError(
            f"task.tokenizer={spec!r} is neither a file nor a hub tokenizer that could be fetched ({exc}); "
            "allowed: bytes, bpe, a local tokenizer.json, or a hub name where the hub is reachable"
        ) from None
    digest = hashlib.sha256(hf.to_str().encode()).hexdigest()
    return Subwords(hf, {"kind": "hub", "name": spec, "sha256": digest})


def trained_bpe(train_docs: list[bytes], vocab_size: int) -> Subwords:
    """A byte-level BPE of `vocab_size` ids trained on `train_docs`, trained once per (corpus, settings): cached as
    <cache_dir>/tokenizers/bpe-<vocab_size>-<key>.json, key = the hash of the corpus and the settings."""
    corpus_sha = hashlib.sha256()
    for d in train_docs:
        corpus_sha.update(hashlib.sha256(d).digest())
    settings = {**BPE_SETTINGS, "vocab_size": vocab_size}
    key = hashlib.sha256(json.dumps([corpus_sha.hexdigest(), settings], sort_keys=True).encode()).hexdigest()
    path = text_cache.cache_dir() / "tokenizers" / f"bpe-{vocab_size}-{key[:20]}.json"
    if path.is_file():
        hf = Tokenizer.from_file(str(path))
    else:
        hf = Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
        hf.train_from_iterator((d.decode("utf-8", errors="replace") for d in train_docs), trainer)
        save_atomically(hf, path)
    merges = json.loads(hf.to_str())["model"]["merges"]
    identity = {
        "kind": BPE,
        "vocab_size": int(hf.get_vocab_size()),
        "corpus_sha256": corpus_sha.hexdigest(),
        "settings": settings,
        "merges_sha256": hashlib.sha256(json.dumps(merges).encode()).hexdigest(),
        "file": str(path),
    }
    return Subwords(hf, identity)


def save_atomically(hf, path: Path):
    """The tokenizer written under a temporary name and renamed: a run killed while writing leaves no partial file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        hf.save(str(tmp))
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(
            f"the trained tokenizer cannot be cached in {path.parent} ({exc.strerror or exc}); "
            "allowed: a writable ATTNLAB_CACHE directory"
        ) from None
