"""Max retrieval (Veličković et al. 2024, "softmax is not enough (for sharp out-of-distribution)", arXiv 2410.01104)."""

from __future__ import annotations

import types

import numpy as np

from attnlab.options import tasks as task_options
from attnlab.tasks.base import Split, Task, disjoint_splits, split_sizes


class MaxRetrieval(Task):
    """A set of items, each a priority p ~ U(0, 1) and a class; predict the class of the highest-priority item.

    Each example is its items (in random order) followed by one query token, right-padded to
    seq_len = n_items + 1. An item token is [p, one-hot class, 0], the query [0, 0…0, 1]
    (input_dim = num_classes + 2). Only the query position carries a target, so a causal model
    answers it from the whole set: one attention row over the n items and itself, the row whose
    sharpness the paper studies. The set size is the length: each example has between `min_items`
    and `n_items` items (uniform); a length-generalisation test varies `n_items`.
    """

    kind = "classification"
    granularity = "token"
    length_option = "n_items"  # task.test_lengths sets it
    tiny_options = types.MappingProxyType({"n_items": 7, "min_items": 3})

    def __init__(
        self,
        n_items: int = 16,
        min_items: int | None = None,
        num_classes: int = 10,
        seed: int = 0,
        n_train: int = 20000,
        n_val: int = 1000,
        n_test: int = 1000,
        default_head: str = "softmax_ce",
        **shared,
    ):
        super().__init__(**shared)  # the options every task takes (Task.__init__)
        task_options.max_retrieval(
            n_items=n_items,
            min_items=min_items,
            num_classes=num_classes,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
        )
        self.n_items = int(n_items)
        self.min_items = self.n_items if min_items is None else int(min_items)
        self.num_classes = int(num_classes)
        self.seq_len = self.n_items + 1
        self.input_dim, self.vocab_size = self.num_classes + 2, None
        self.default_head = default_head
        self.options = dict(
            n_items=n_items,
            min_items=min_items,
            num_classes=num_classes,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            default_head=default_head,
        )
        self.splits = disjoint_splits(self._sample, split_sizes(n_train, n_val, n_test), int(seed))

    def _sample(self, rng: np.random.Generator, n: int) -> Split:
        """Draw n examples: sizes, priorities, classes; the query token right after the last item."""
        T, C = self.seq_len, self.num_classes
        sizes = rng.integers(self.min_items, self.n_items + 1, size=n)
        priority = rng.random((n, self.n_items)).astype(np.float32)
        classes = rng.integers(0, C, size=(n, self.n_items))
        item = np.arange(self.n_items)[None, :] < sizes[:, None]
        inputs = np.zeros((n, T, C + 2), np.float32)
        inputs[:, :-1, 0] = np.where(item, priority, 0.0)
        inputs[:, :-1, 1 : C + 1] = np.eye(C, dtype=np.float32)[classes] * item[..., None]
        rows = np.arange(n)
        inputs[rows, sizes, C + 1] = 1.0  # the query token
        best = np.argmax(np.where(item, priority, -1.0), axis=1)
        targets = np.zeros((n, T), np.int32)
        targets[rows, sizes] = classes[rows, best]
        weights = np.zeros((n, T), np.float32)
        weights[rows, sizes] = 1.0
        valid = np.arange(T)[None, :] <= sizes[:, None]
        return Split(inputs, targets, weights, valid)

    def baseline(self, split: str) -> dict[str, float]:
        """Chance accuracy 1/num_classes: the winner's class is uniform and independent of its priority."""
        self.splits[split]  # a KeyError for unknown split names
        return {"accuracy": 1.0 / self.num_classes}
