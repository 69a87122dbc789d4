"""Language modelling on bytes or subword tokens: the task (task.py), its corpora (corpus.py), its subword tokenizers
(subwords.py), the streams its windows are cut from and their baselines (streams.py), the cache a large training text
is memory-mapped from (text_cache.py), how a step draws its windows on the device or from the host (host_stream.py),
and how a model continues a prompt (continuation.py)."""

from __future__ import annotations

from attnlab.options.tasks import EVAL_BYTES, check_device_text_bytes, eval_windows
from attnlab.tasks.lm.streams import bigram_entropy_bits, split_documents, unigram_entropy_bits
from attnlab.tasks.lm.task import DEVICE_TEXT_BYTES, PAD, LanguageModel

__all__ = [
    "DEVICE_TEXT_BYTES",
    "EVAL_BYTES",
    "PAD",
    "LanguageModel",
    "bigram_entropy_bits",
    "check_device_text_bytes",
    "eval_windows",
    "split_documents",
    "unigram_entropy_bits",
]
