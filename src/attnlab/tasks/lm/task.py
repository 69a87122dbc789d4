"""Language modelling: predict each next byte (or subword token) of real text, split by document."""

from __future__ import annotations

import math
import sys
import types

import numpy as np

from attnlab.checks import ConfigError
from attnlab.options import tasks as task_options
from attnlab.options.tasks import eval_windows
from attnlab.tasks.base import INT32_MAX, SPLITS, Split, Task, majority_accuracy
from attnlab.tasks.lm import continuation, subwords, text_cache
from attnlab.tasks.lm import corpus as corpora
from attnlab.tasks.lm.host_stream import BOS_SYMBOL, BosTextWindows, HostStream, TextWindows
from attnlab.tasks.lm.streams import (
    bigram_entropy_bits,
    bos_split,
    packed,
    split_documents,
    symbol_dtype,
    unigram_entropy_bits,
)

PAD = 0  # input id 0 is padding; byte b is input id b + 1
# task.bos=true: a document start in the packed stream is the symbol BOS_SYMBOL (the stream is uint16; a byte is its
# own symbol), input id BOS = BOS_SYMBOL + 1, the one id past the bytes' (host_stream); never a class (its target
# has weight 0).
# Training text up to 1 GiB stays on the device (uint8): a few percent of an 80 GB GPU beside a model's
# parameters, optimizer state and activations, and half the int32 limit of device offsets (INT32_MAX).
DEVICE_TEXT_BYTES = 2**30


class LanguageModel(Task):
    """Next-byte prediction on windows of `seq_len` bytes (inputs: byte + 1, 0 = padding; targets: the next byte).

    The corpus (a shipped one, `corpus`: CPython's pydoc topics by default; or `path`; or `hf_dataset`) is a list of
    documents; whole documents go to test, then val (seeded, until each holds its fraction of the bytes), the
    rest to train, so no test text is seen in training; fewer than 3 documents (one long file) are
    split by contiguous byte ranges instead (corpus.byte_ranges; `corpus.split` in run.json says
    which). Each split's documents are joined and `n_<split>` random windows of seq_len + 1 bytes are
    drawn from it (seeded; n_val/n_test=auto: eval_windows); a val/train window equal to an earlier split's
    is redrawn. Training does not use the fixed train windows: each step
    draws its own from the whole training text (`batches`: host_stream.TextWindows, or a HostStream over
    task.device_text_bytes), at offsets from (seed, step). `self.corpus` records the source's identity (for run.json).
    Baselines, in bits per byte, are the training text's unigram entropy and bigram conditional entropy.

    ``bos=true`` (a beginning of sequence, as the corpora the attention-sink papers measured are packed): each split's
    text is its documents packed back to back, each opened by a reserved BOS (no separator: ``stream``, uint16 with
    BOS_SYMBOL at every document start; with contiguous byte ranges, one BOS opens each split's range), and every
    window's first input (train, val, test, test lengths) is BOS (input id 257: ``vocab_size`` 258): a window of
    seq_len + 1 symbols at a uniform offset, its first replaced by BOS, predicts the same seq_len next symbols. A BOS
    inside a window is an input (a document start) and, one position earlier, a target of weight 0 (placeholder 0):
    ``num_classes`` stays 256, and the loss, accuracy and bits per byte count bytes only. The baselines are the bytes'
    (the plain text's entropies, the majority byte). The training text must fit on the device (task.device_text_bytes;
    no host stream under bos). ``bos=false`` (default): the windows are those of the joined text, unchanged.

    ``tokenizer`` other than bytes (subwords.load: ``bpe``, trained on the training documents, or a tokenizer.json or
    hub name): each split's ``stream`` is its text's token ids (under bos each document's, opened by ``bos_symbol``,
    the id past the vocabulary), windows count tokens, ``num_classes`` is the vocabulary, and bits per byte is bits per
    token times the split's ``tokens_per_byte`` (derived_metrics); the baselines are the training tokens' unigram
    rate per byte and the majority token. The stream stays on the device (no host stream).
    """

    kind = "classification"
    granularity = "token"
    length_option = "seq_len"  # task.test_lengths sets it
    tiny_options = types.MappingProxyType({"seq_len": 16})
    is_text = True
    headline_metric = "bits_per_byte"
    baseline_labels = {
        "bits_per_byte": {"bits_per_byte": "unigram", "bits_per_byte_bigram": "bigram"},
        "accuracy": {"accuracy": "majority byte"},
    }

    def __init__(
        self,
        seq_len: int = 64,
        corpus: str = "pydoc_topics",
        path: str | None = None,
        hf_dataset: str | None = None,
        hf_config: str | None = None,
        hf_split: str = "train",
        hf_column: str = "text",
        hf_data_files: str | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        n_train: int = 500,
        n_val: int | str = "auto",
        n_test: int | str = "auto",
        default_head: str = "softmax_ce",
        device_text_bytes: int = DEVICE_TEXT_BYTES,
        bos: bool = False,
        tokenizer: str = subwords.BYTES,
        bpe_vocab_size: int = 2048,
        **shared,
    ):
        super().__init__(**shared)  # the options every task takes (Task.__init__)
        task_options.lm(
            seq_len=seq_len,
            corpus=corpus,
            path=path,
            hf_dataset=hf_dataset,
            hf_config=hf_config,
            hf_split=hf_split,
            hf_column=hf_column,
            hf_data_files=hf_data_files,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            device_text_bytes=device_text_bytes,
            bos=bos,
            tokenizer=tokenizer,
            bpe_vocab_size=bpe_vocab_size,
        )
        self.seq_len, self.bos, self.tokenizer, seed = int(seq_len), bos, tokenizer, int(seed)
        fractions = {"test": float(test_fraction), "val": float(val_fraction)}
        sizes = {s: int(eval_windows(f"n_{s}", n, self.seq_len)) for s, n in zip(SPLITS, (n_train, n_val, n_test))}
        self.input_dim, self.default_head = None, default_head
        self.options = dict(
            seq_len=seq_len,
            corpus=corpus,
            path=path,
            hf_dataset=hf_dataset,
            hf_config=hf_config,
            hf_split=hf_split,
            hf_column=hf_column,
            hf_data_files=hf_data_files,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            default_head=default_head,
            device_text_bytes=device_text_bytes,
            bos=bos,
            tokenizer=tokenizer,
            bpe_vocab_size=bpe_vocab_size,
        )
        budget = int(device_text_bytes)
        if hf_dataset is not None:
            docs, self.corpus = corpora.from_hf(hf_dataset, hf_config, hf_split, hf_column, hf_data_files)
        elif path is not None:
            docs, self.corpus = corpora.from_path(path)
        else:
            docs, self.corpus = corpora.SHIPPED[corpus]()
        rngs = dict(zip(("documents", *SPLITS), np.random.SeedSequence(seed).spawn(1 + len(SPLITS))))
        if len(docs) >= 3:
            self.documents = split_documents(docs, fractions, np.random.default_rng(rngs["documents"]))
            self.text = {
                s: np.frombuffer(corpora.SEPARATOR.join([docs[i] for i in idx]), np.uint8)
                for s, idx in self.documents.items()
            }
            self.corpus["split"] = "by document"
        else:  # one long text: no documents to hold out, so contiguous byte ranges (still no shared text)
            ranges = corpora.byte_ranges(corpora.SEPARATOR.join(docs), fractions)
            self.documents = {s: np.zeros(0, np.int64) for s in SPLITS}
            self.text = {s: np.frombuffer(ranges[s], np.uint8) for s in SPLITS}
            self.corpus["split"] = "contiguous byte ranges (train | val | test)"
        # Each split's documents (its byte range); under bos each is opened by BOS in the split's stream.
        split_docs = {s: [docs[i] for i in idx] or [self.text[s].tobytes()] for s, idx in self.documents.items()}
        self.subwords = None
        if self.tokenizer != subwords.BYTES:
            self.subwords = subwords.load(self.tokenizer, bpe_vocab_size, split_docs["train"])
            self.baseline_labels = {**self.baseline_labels, "accuracy": {"accuracy": "majority token"}}
        # The token ids are [0, num_classes); bos_symbol, one past them, opens a document under bos.
        self.num_classes = self.bos_symbol = 256 if self.subwords is None else self.subwords.vocab_size
        self.vocab_size = self.num_classes + 1 + self.bos  # input ids: token + 1, 0 padding, BOS last under bos
        # Over the budget the training text leaves host memory for a cache file the loader maps (host_stream).
        self.train_data = "device" if len(self.text["train"]) <= budget else "host-stream"
        self._refuse_host_stream(budget)
        if self.train_data == "host-stream":
            self.text["train"] = text_cache.memmap_text(self.text["train"])
        self.stream, self.tokens_per_byte = self._streams(split_docs)
        self.corpus = {
            **self.corpus,
            "split_bytes": {s: int(len(t)) for s, t in self.text.items()},
            "tokenizer": {"kind": subwords.BYTES} if self.subwords is None else self.subwords.identity,
            "tokens_per_byte": self.tokens_per_byte,
            "train_tokens": int(len(self.stream["train"])),  # what a run's passes over its training text count
        }
        self._check_split_lengths(fractions)
        self.splits = self._splits(sizes, rngs)
        train = self.stream["train"]  # the baselines of bytes are the plain text's, of subwords the tokens' (no BOS)
        self.train_tokens = self.text["train"] if self.subwords is None else train[train != self.bos_symbol]
        n, per_byte = self.num_classes, self.tokens_per_byte["train"]
        # A token model's rates, in bits per byte of the training text. The bigram rate of subwords is left out: its
        # V² pairs counted on the text they are scored on make an in-sample rate far below what held-out text allows.
        self._entropy = {"bits_per_byte": unigram_entropy_bits(self.train_tokens, n) * per_byte}
        if self.subwords is None:
            self._entropy["bits_per_byte_bigram"] = bigram_entropy_bits(self.train_tokens)

    def _splits(self, sizes: dict[str, int], rngs: dict) -> dict[str, Split]:
        """n_<split> windows of each split's stream (its text, or tokens; under bos packed), test first (it does not
        change with n_train)."""
        splits, seen = {}, set()
        for s in ("test", "val", "train"):
            if self.bos:
                windows = self._windows(self.stream[s], sizes[s], np.random.default_rng(rngs[s]), seen, skip=1)
                splits[s] = bos_split(windows, self.bos_symbol)
                continue
            windows = self._windows(self.stream[s], sizes[s], np.random.default_rng(rngs[s]), seen)
            splits[s] = Split(
                windows[:, :-1].astype(np.int32) + 1,
                windows[:, 1:].astype(np.int32),
                np.ones((sizes[s], self.seq_len), np.float32),
                np.ones((sizes[s], self.seq_len), bool),
            )
        return {s: splits[s] for s in SPLITS}

    def _streams(self, split_docs: dict[str, list[bytes]]) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Each split's token stream, its windows' source, and its tokens per byte (the test split's turns nats
        per token into bits per byte): bytes are the text itself (1 token per byte); under bos the documents packed,
        each opened by bos_symbol; subword streams encode the text (under bos each document) and count their tokens
        against the bytes they encode."""
        if self.subwords is None:
            one_per_byte = dict.fromkeys(SPLITS, 1.0)
            if not self.bos:
                return self.text, one_per_byte
            return {
                s: packed([np.frombuffer(d, np.uint8) for d in split_docs[s]], BOS_SYMBOL) for s in SPLITS
            }, one_per_byte
        stream, per_byte, dtype = {}, {}, symbol_dtype(self.bos_symbol)
        for s in SPLITS:
            docs = split_docs[s] if self.bos else [self.text[s].tobytes()]
            tokens = self.subwords.encode_documents(docs, corpora.SEPARATOR)
            stream[s] = packed(tokens, self.bos_symbol) if self.bos else tokens[0].astype(dtype)
            per_byte[s] = sum(map(len, tokens)) / max(sum(map(len, docs)), 1)
        return stream, per_byte

    def _refuse_host_stream(self, budget: int):
        """bos and subword tokens keep the training stream on the device: over task.device_text_bytes, a clear error."""
        needs = ["task.bos=true"] * self.bos + [f"task.tokenizer={self.tokenizer}"] * (self.subwords is not None)
        if self.train_data != "host-stream" or not needs:
            return
        raise ConfigError(
            f"{' and '.join(needs)} keep the training text on the device, and its {len(self.text['train'])} bytes are "
            f"over task.device_text_bytes={budget}; raise task.device_text_bytes (at most {INT32_MAX}), use "
            "less text, or task.bos=false task.tokenizer=bytes"
        )

    def _check_split_lengths(self, fractions: dict[str, float]):
        """Each split's stream must hold one window of seq_len + 1 tokens; the fix names keys that exist and values
        that work."""
        short = [s for s, stream in self.stream.items() if len(stream) < self.seq_len + 1]
        if not short:
            return
        s = short[0]
        longest = min(len(t) for t in self.stream.values()) - 1
        fixes = ["use more text (task.path)"]
        if longest >= 2:
            fixes.append(f"task.seq_len={longest} or smaller")
        if s == "train":  # the train split is what val and test leave
            fixes.append(
                f"smaller task.val_fraction and task.test_fraction (now {fractions['val']} and {fractions['test']})"
            )
        elif fractions[s] < 0.5:
            fixes.append(f"a larger task.{s}_fraction (now {fractions[s]}, at most 0.5)")
        unit = "bytes" if self.subwords is None else "tokens"
        raise ConfigError(
            f"the {s} split holds {len(self.stream[s])} {unit} ({self.corpus['split']}), fewer than "
            f"task.seq_len + 1 = {self.seq_len + 1}; " + ", or ".join(fixes)
        )

    def _windows(self, text_U8, n: int, rng, seen: set, max_rounds: int = 50, skip: int = 0) -> np.ndarray:
        """n windows of seq_len + 1 bytes at uniform random offsets, none with the inputs of an earlier split
        (the inputs past the first `skip`: under bos the first is BOS whatever the window holds there)."""
        view = np.lib.stride_tricks.sliding_window_view(text_U8, self.seq_len + 1)
        kept: list[np.ndarray] = []
        for _ in range(max_rounds):
            for w in view[rng.integers(0, len(view), n - len(kept))]:
                if w[skip:-1].tobytes() not in seen:
                    kept.append(w)
            if len(kept) == n:
                break
        if len(kept) < n:
            raise ConfigError(
                f"could not draw {n} windows unseen in other splits; use more text (task.path) or a "
                f"smaller task.seq_len (now {self.seq_len})"
            )
        seen.update(w[skip:-1].tobytes() for w in kept)
        return np.stack(kept)

    def batches(self, batch_size: int, key_data_S2=None, *, start: int = 0, stop: int | None = None, sharding=None):
        """Windows of seq_len + 1 bytes at offsets drawn from (seed, step) over the whole training text: on the
        device (TextWindows), or gathered on the host from the memory-mapped text (HostStream) when it is over
        task.device_text_bytes (train_data: host-stream), the steps start..stop − 1 for the seeds' keys."""
        text, window = self.stream["train"], self.seq_len + 1
        if self.bos:
            return BosTextWindows(text, np.arange(window, dtype=np.int32), self.bos_symbol)
        if self.train_data == "device":
            return TextWindows(text, np.arange(window, dtype=np.int32))
        print(
            f"attnlab: train_data: host-stream (the training text, {len(text)} bytes, is over "
            f"task.device_text_bytes; memory-mapped from {getattr(text, 'filename', '?')})",
            file=sys.stderr,
        )
        return HostStream(text, window, key_data_S2, batch_size, sharding, start=start, stop=stop)

    def baseline(self, split: str) -> dict[str, float]:
        """Majority-token accuracy, and the training tokens' entropies in bits per byte (unigram; bigram for bytes)."""
        s = self.splits[split]
        return {"accuracy": majority_accuracy(self.train_tokens, s.targets, s.weights), **self._entropy}

    def plateaus(self) -> dict[str, dict[str, float]]:
        """The training tokens' unigram and bigram rates: a model that predicts tokens by frequency alone, or from
        the previous token alone, sits there."""
        labels = self.baseline_labels["bits_per_byte"]
        return {"test/bits_per_byte": {labels[k]: v for k, v in self._entropy.items()}}

    def derived_metrics(self, metrics: dict[str, float], split: str) -> dict[str, float]:
        """From the head's nll in nats per token: perplexity = exp(nll) per token, bits_per_byte = nll / ln 2 times
        the split's tokens per byte (1 for bytes; a test length's windows are the test split's), and, for subword
        tokens, bits_per_token = nll / ln 2."""
        if "nll" not in metrics:
            return {}
        bits = metrics["nll"] / math.log(2)
        per_byte = self.tokens_per_byte["test" if split.startswith("test") else split]
        out = {"bits_per_byte": bits * per_byte, "perplexity": math.exp(min(metrics["nll"], 700.0))}
        return out if self.subwords is None else {**out, "bits_per_token": bits}

    def decode(self, tokens_T) -> str:
        """Input ids back to text (padding dropped, invalid UTF-8 replaced; BOS, under bos, as BOS_TEXT)."""
        ids = [int(t) for t in np.asarray(tokens_T).ravel() if t != PAD]
        text, run = "", []
        for t in ids:
            if self.bos and t == self.bos_symbol + 1:
                text, run = text + self._decode_tokens(run) + BOS_TEXT, []
            else:
                run.append(t - 1)
        return text + self._decode_tokens(run)

    def _decode_tokens(self, tokens: list[int]) -> str:
        if self.subwords is None:
            return bytes(tokens).decode("utf-8", errors="replace")
        return self.subwords.decode(tokens)

    def continuation(self, graphdef):
        """The shown example's first bytes continued greedily (continuation.make_continuation)."""
        return continuation.make_continuation(graphdef, seq_len=self.seq_len)

    def split_continuation(self, written_L) -> tuple[str, str]:
        """(prompt, continuation) as text: the first continuation.prompt_length(L) bytes are the prompt."""
        start = continuation.prompt_length(len(written_L))
        return self.decode(written_L[:start]), self.decode(written_L[start:])


BOS_TEXT = "\u25c6"  # ◆: how decode shows BOS (one character, as a byte's label is, in the attention images' font)
