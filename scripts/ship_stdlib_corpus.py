"""Writes attnlab's second shipped lm corpus, src/attnlab/tasks/lm/data/python_stdlib.json.xz, from the standard
library of the CPython running it (3.11.7 for the pinned copy: corpus.PYTHON_STDLIB_SHA256).

Every .py file of the standard library but its tests, the generated codec tables (encodings/), the pydoc topics (the
other shipped corpus) and the installed packages (site-packages/): 536 files, 9.7 MB of human-written code, comments
and docstrings, one document per file. It exists so that an lm study can train without repeating its training text:
the default corpus's 0.36 MB of training text is ~0.1M tokens of a 2,048-id BPE, which a 400-step run of 64 windows of
64 tokens passes over 16 times.

    python scripts/ship_stdlib_corpus.py    # then pin the printed sha256 in corpus.PYTHON_STDLIB_SHA256
"""

from __future__ import annotations

import json
import lzma
import sys
import sysconfig
from pathlib import Path

from attnlab.tasks.lm import corpus

LEFT_OUT = {"site-packages", "test", "tests", "idle_test", "encodings", "pydoc_data", "lib2to3"}


def stdlib_files(root: Path) -> dict[str, str]:
    """{path relative to the standard library: its text} for every .py file outside LEFT_OUT, in path order."""
    files = sorted(
        p for p in root.rglob("*.py") if not LEFT_OUT & set(p.relative_to(root).parts) and "config-" not in str(p)
    )
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in files}


def main() -> None:
    files = stdlib_files(Path(sysconfig.get_paths()["stdlib"]))
    python = sys.version.split()[0]
    payload = json.dumps({"python": python, "files": files}, ensure_ascii=False, sort_keys=True).encode("utf-8")
    corpus.PYTHON_STDLIB.write_bytes(lzma.compress(payload, preset=9))
    ident = corpus.identity("python_stdlib", [files[name].encode("utf-8") for name in sorted(files)])
    print(f"{corpus.PYTHON_STDLIB}: {ident['documents']} files, {ident['bytes']:,} bytes, sha256 {ident['sha256']}")


if __name__ == "__main__":
    main()
