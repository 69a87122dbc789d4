"""Multi-query associative recall (MQAR), after Zoology (Arora et al. 2023)."""

from __future__ import annotations

import types

import numpy as np

from attnlab.checks import ConfigError
from attnlab.options import tasks as task_options
from attnlab.tasks.base import Split, Task, disjoint_splits, split_sizes


class MQAR(Task):
    """Recall the value bound to each queried key: ``k1 v1 k2 v2 ... | . . k2 . k1 .``.

    Follows HazyResearch/zoology zoology/data/multiquery_ar.py: keys are drawn without
    replacement from [1, V/2) and values from [V/2, V); the context is the interleaved pairs;
    each key is queried once in the remainder, at even offsets ``2g`` with ``g`` drawn without
    replacement from the power law ``p(g) ∝ a (g+1)^(a-1)``. The label (the paired value) sits
    at the query position itself, so a causal model predicts it from the prefix; only query
    positions carry weight. Unlike zoology, ``vocab_size > seq_len`` is not required.

    ``test_pairs`` sets the pairs of the test splits at other lengths (task.test_lengths): ``same``
    (num_kv_pairs in a longer context), ``scale`` (num_kv_pairs · T / seq_len, rounded down, at least 1:
    the same pairs per token) or a list of integers, one per test length in the order given.
    """

    kind = "classification"
    granularity = "token"
    length_option = "seq_len"  # task.test_lengths sets it
    tiny_options = types.MappingProxyType({"seq_len": 16, "vocab_size": 16, "num_kv_pairs": 2})

    def __init__(
        self,
        vocab_size: int = 64,
        seq_len: int = 64,
        num_kv_pairs: int = 4,
        power_a: float = 0.01,
        random_filler: bool = False,
        test_pairs="same",
        seed: int = 0,
        n_train: int = 20000,
        n_val: int = 1000,
        n_test: int = 1000,
        default_head: str = "softmax_ce",
        **shared,
    ):
        super().__init__(**shared)  # the options every task takes (Task.__init__)
        task_options.mqar(
            vocab_size=vocab_size,
            seq_len=seq_len,
            num_kv_pairs=num_kv_pairs,
            power_a=power_a,
            random_filler=random_filler,
            test_pairs=test_pairs,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
        )
        self.vocab_size, self.seq_len, self.num_kv_pairs = int(vocab_size), int(seq_len), int(num_kv_pairs)
        self.power_a, self.random_filler = float(power_a), random_filler
        self.test_pairs = test_pairs if test_pairs in ("same", "scale") else [int(k) for k in test_pairs]
        self.num_classes = self.vocab_size  # targets are token ids
        self.input_dim = None
        self.default_head = default_head
        sizes = split_sizes(n_train, n_val, n_test)
        self.options = dict(
            vocab_size=vocab_size,
            seq_len=seq_len,
            num_kv_pairs=num_kv_pairs,
            power_a=power_a,
            random_filler=random_filler,
            test_pairs=test_pairs,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            default_head=default_head,
        )
        self.splits = disjoint_splits(self._sample, sizes, int(seed))

    def max_pairs(self, seq_len: int) -> int:
        """The most pairs at a length (options.tasks.mqar_max_pairs)."""
        return task_options.mqar_max_pairs(seq_len, self.vocab_size)

    def length_options(self, lengths: list[int]) -> dict[int, dict]:
        """{T: seq_len T and its number of pairs} (see `test_pairs`); a count a length cannot hold is refused."""
        if isinstance(self.test_pairs, list) and len(self.test_pairs) != len(lengths):
            raise ConfigError(
                f"task.test_pairs={self.test_pairs} has {len(self.test_pairs)} counts for {len(lengths)} "
                f"task.test_lengths={lengths}; allowed: same, scale or one count per test length"
            )
        out = {}
        for i, length in enumerate(lengths):
            pairs = self.pairs_at(length, i)
            if pairs > self.max_pairs(length):
                raise ConfigError(
                    f"task.test_pairs={self.test_pairs} gives {pairs} pairs at task.seq_len={length}; allowed: at "
                    f"most min(seq_len/4, vocab_size/2 - 1) = {self.max_pairs(length)} (raise task.vocab_size or "
                    "lower the pairs)"
                )
            out[length] = {"seq_len": length, "num_kv_pairs": pairs}
        return out

    def pairs_at(self, length: int, index: int) -> int:
        """The pairs of the test split at the index-th test length."""
        if self.test_pairs == "same":
            return self.num_kv_pairs
        if self.test_pairs == "scale":
            return max(1, self.num_kv_pairs * length // self.seq_len)
        return self.test_pairs[index]

    def _sample(self, rng: np.random.Generator, n: int) -> Split:
        """Draw n examples (possibly with duplicates; the caller drops them)."""
        V, T, k = self.vocab_size, self.seq_len, self.num_kv_pairs
        half = V // 2
        rows = np.arange(n)[:, None]
        # Distinct keys/values per row: the first k of a uniform random permutation (== choice without replacement).
        keys = np.argsort(rng.random((n, half - 1)), axis=1)[:, :k] + 1
        values = np.argsort(rng.random((n, V - half)), axis=1)[:, :k] + half
        ctx = 2 * k
        inputs = np.zeros((n, T), dtype=np.int32)
        inputs[:, 0:ctx:2] = keys
        inputs[:, 1:ctx:2] = values
        # Query slots: zoology's power law p(g) ∝ a*g^(a-1) on g = 1..space, sampled without replacement;
        # the Gumbel-top-k trick gives exactly sequential sampling without replacement, vectorised.
        space = (T - ctx) // 2
        logp = np.log(self.power_a) + (self.power_a - 1.0) * np.log(np.arange(1, space + 1))
        gaps = np.argsort(-(logp + rng.gumbel(size=(n, space))), axis=1)[:, :k]
        qpos = ctx + 2 * gaps
        inputs[rows, qpos] = keys
        targets = np.zeros((n, T), dtype=np.int32)
        targets[rows, qpos] = values
        weights = np.zeros((n, T), dtype=np.float32)
        weights[rows, qpos] = 1.0
        if self.random_filler:
            # zoology's random_non_queries: every 0 (non-pair, non-query) token becomes uniform in [0, V).
            filler = rng.integers(0, V, size=(n, T), dtype=np.int32)
            inputs = np.where(inputs == 0, filler, inputs)
        return Split(inputs, targets, weights, np.ones((n, T), dtype=bool))

    def plateaus(self) -> dict[str, dict[str, float]]:
        """1/pairs: a model that retrieves the context's values but not the one a query asks for guesses among the
        num_kv_pairs values (linear attention at model=tiny or small sits there: docs/REFERENCE.md, Which scale ...)."""
        return {"test/accuracy": {"1/pairs": 1.0 / self.num_kv_pairs}}

    def baseline(self, split: str) -> dict[str, float]:
        """Chance accuracy: one over the number of possible values, V - V/2."""
        self.splits[split]  # a KeyError for unknown split names
        return {"accuracy": 1.0 / (self.vocab_size - self.vocab_size // 2)}
