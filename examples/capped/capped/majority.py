"""Majority vote: is a string of bits mostly ones? Every token matters equally, so attention must spread."""

from __future__ import annotations

import numpy as np

from attnlab.checks import ConfigError
from attnlab.tasks.base import Split, Task, check_int, disjoint_splits, majority_accuracy, split_sizes


class Majority(Task):
    """Classify a string of `length` random bits (odd) by whether ones outnumber zeros; tokens 0 and 1."""

    kind = "classification"
    granularity = "sequence"
    baseline_labels = {"accuracy": {"accuracy": "majority class"}}
    length_option = "length"

    def __init__(self, length=15, n_train=2048, n_val=256, n_test=256, seed=0, default_head="softmax_ce", **shared):
        super().__init__(**shared)  # the options every task takes (test_lengths)
        self.seq_len = check_int("length", length, 1, 64)
        if self.seq_len % 2 == 0:
            raise ConfigError(f"task.length={length} is invalid; allowed: an odd integer (no ties)")
        self.vocab_size, self.num_classes, self.default_head = 2, 2, default_head
        sizes = split_sizes(n_train, n_val, n_test)
        self.options = dict(
            length=length, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed, default_head=default_head
        )
        self.splits = disjoint_splits(self._sample, sizes, check_int("seed", seed, 0))

    def _sample(self, rng: np.random.Generator, n: int) -> Split:
        bits = rng.integers(0, 2, size=(n, self.seq_len)).astype(np.int32)
        targets = (2 * bits.sum(-1) > self.seq_len).astype(np.int32)
        return Split(bits, targets, np.ones(n, np.float32), np.ones_like(bits, bool))

    def baseline(self, split: str) -> dict[str, float]:
        """Accuracy of always answering the most frequent train class."""
        s = self.splits[split]
        return {"accuracy": majority_accuracy(self.splits["train"].targets, s.targets, s.weights)}
