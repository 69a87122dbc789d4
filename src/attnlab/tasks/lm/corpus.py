"""Text corpora for the lm task: a list of documents (bytes) and the corpus's identity for run.json."""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import lzma
import os
import re
import sys
from pathlib import Path

from attnlab.checks import ConfigError

SEPARATOR = b"\n\n"  # between the documents of one split (what a paragraph split removed)


def identity(source: str, docs: list[bytes], **extra) -> dict:
    """Source, Python version (of the text's source: this interpreter unless `extra` names another), size in
    bytes, sha256 of the documents joined in order, and their number."""
    digest = hashlib.sha256(SEPARATOR.join(docs)).hexdigest()
    return {
        "source": source,
        "python": sys.version.split()[0],
        "bytes": sum(map(len, docs)),
        "sha256": digest,
        "documents": len(docs),
        **extra,
    }


# The default corpus is CPython 3.11.7's pydoc topics, shipped as package data: each Python release rewrites
# them (3.12.1's are 493,344 bytes against 466,117), and the same command must train on the same bytes under
# every Python. The hash is of the documents joined by SEPARATOR, as `identity` computes it.
PYDOC_TOPICS = Path(__file__).with_name("data") / "pydoc_topics.json.gz"
PYDOC_TOPICS_SHA256 = "71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee"


def pydoc_topics(path: Path = PYDOC_TOPICS) -> tuple[list[bytes], dict]:
    """CPython 3.11.7's documentation topics (pydoc_data.topics, the text behind `help('TOPIC')`), one per
    document, from the copy attnlab ships; a copy whose content is not the pinned one is refused.

    Real English written by CPython's documentation authors: no download, and the same bytes on every Python.
    """
    with gzip.open(path, "rb") as f:
        shipped = json.loads(f.read().decode("utf-8"))
    return _pinned(path, "pydoc_data.topics", shipped["topics"], shipped["python"], PYDOC_TOPICS_SHA256)


def _pinned(path: Path, source: str, texts: dict[str, str], python: str, sha256: str) -> tuple[list[bytes], dict]:
    """A shipped corpus's documents in name order and its identity; RuntimeError where its hash is not `sha256`."""
    docs = [texts[name].encode("utf-8") for name in sorted(texts)]
    ident = identity(source, docs, python=python)
    if ident["sha256"] != sha256:
        raise RuntimeError(
            f"the lm corpus {path} has sha256 {ident['sha256']}, not the pinned {sha256}: a damaged install; "
            "reinstall attnlab"
        )
    return docs, ident


# The second shipped corpus, for studies whose runs would otherwise pass over the pydoc topics' training text many
# times: CPython 3.11.7's standard library source (scripts/ship_stdlib_corpus.py says which files), pinned as above.
PYTHON_STDLIB = PYDOC_TOPICS.with_name("python_stdlib.json.xz")
PYTHON_STDLIB_SHA256 = "a113be986bd4353cb606fb435ee07851e9ea36eb3ca98d1d908f58f0ec05f805"


def python_stdlib(path: Path = PYTHON_STDLIB) -> tuple[list[bytes], dict]:
    """CPython 3.11.7's standard library source, one document per .py file (9.7 MB: code, comments and docstrings
    written by CPython's authors), from the copy attnlab ships; a copy whose content is not the pinned one is refused.
    """
    shipped = json.loads(lzma.decompress(path.read_bytes()).decode("utf-8"))
    return _pinned(path, "python_stdlib", shipped["files"], shipped["python"], PYTHON_STDLIB_SHA256)


SHIPPED = {"pydoc_topics": pydoc_topics, "python_stdlib": python_stdlib}  # task.corpus: the shipped corpora


def _paragraphs(text: bytes) -> list[bytes]:
    return [p for p in re.split(rb"\n[ \t\r]*\n", text) if p.strip()]


def byte_ranges(text: bytes, fractions: dict[str, float]) -> dict[str, bytes]:
    """A corpus of fewer than 3 documents (one long file, nanoGPT-style) as contiguous ranges: train | val | test.

    Like nanoGPT's shakespeare_char prepare.py (first 90% train, last 10% val), with test after val.
    """
    n = len(text)
    val_start = round(n * (1 - fractions["val"] - fractions["test"]))
    test_start = round(n * (1 - fractions["test"]))
    return {"train": text[:val_start], "val": text[val_start:test_start], "test": text[test_start:]}


def from_path(path: str) -> tuple[list[bytes], dict]:
    """The files named by `path` (a file, a directory searched recursively, or a glob), one document each.

    With fewer than 3 files there are too few documents to split by document, so each file's
    paragraphs (blank-line separated) are the documents instead; still fewer than 3, the lm task
    splits by `byte_ranges`.
    """
    p = Path(os.path.expanduser(path))
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file())
    else:
        files = sorted(Path(f) for f in glob.glob(os.path.expanduser(path), recursive=True) if Path(f).is_file())
    if not files:
        raise ConfigError(f"task.path={path!r} matches no file; allowed: a file, a directory or a glob of text files")
    docs = [d for d in (f.read_bytes() for f in files) if d.strip()]
    if len(docs) < 3:
        docs = [para for d in docs for para in _paragraphs(d)]
    return docs, identity(f"path:{path}", docs, files=len(files))


def from_hf(name: str, config: str | None, split: str, column: str, data_files) -> tuple[list[bytes], dict]:
    """Rows of a Hugging Face `datasets` split, one document per non-empty `column` value."""
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(f"task.hf_dataset={name!r} needs the `datasets` library: pip install 'attnlab[hf]'") from exc
    try:
        ds = datasets.load_dataset(name, config, split=split, data_files=data_files)
    except Exception as exc:  # network, unknown name or split: one line, not a traceback
        raise ConfigError(
            f"task.hf_dataset={name!r} (config {config!r}, split {split!r}) could not be loaded: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if column not in ds.column_names:
        raise ConfigError(
            f"task.hf_column={column!r} is not a column of {name!r}; allowed: {', '.join(ds.column_names)}"
        )
    docs = [str(x).encode("utf-8") for x in ds[column] if x and str(x).strip()]
    return docs, identity(
        f"hf:{name}", docs, config=config, split=split, column=column, datasets_version=datasets.__version__
    )
