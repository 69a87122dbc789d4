"""scikit-learn's bundled 8x8 handwritten digits (UCI optdigits test set), read row by row as 8 tokens."""

from __future__ import annotations

import numpy as np

from attnlab.options import tasks as task_options
from attnlab.tasks.base import Split, Task, majority_accuracy


def _split(images: np.ndarray, labels: np.ndarray) -> Split:
    """A Split of (N,8,8) images in [0,1] and their labels; every row is a real token."""
    n, t = images.shape[:2]
    return Split(images.astype(np.float32), labels.astype(np.int32), np.ones(n, np.float32), np.ones((n, t), bool))


class Digits(Task):
    """Classify an 8x8 digit image given as a sequence of its 8 pixel rows (input_dim 8), 10 classes."""

    kind = "classification"
    baseline_labels = {"accuracy": {"accuracy": "majority class"}}
    granularity = "sequence"
    no_length_reason = "its images have 8 rows"

    def __init__(
        self,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        seed: int = 0,
        default_head: str = "softmax_ce",
        **shared,
    ):
        super().__init__(**shared)  # the options every task takes (Task.__init__)
        task_options.digits(val_fraction=val_fraction, test_fraction=test_fraction, seed=seed)
        val_fraction, test_fraction, seed = float(val_fraction), float(test_fraction), int(seed)
        self.seq_len, self.input_dim, self.vocab_size, self.num_classes = 8, 8, None, 10
        self.default_head = default_head
        self.options = dict(
            val_fraction=val_fraction, test_fraction=test_fraction, seed=seed, default_head=default_head
        )
        # scikit-learn is imported here, not with the module: no other task pays its import (tests/test_imports.py).
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        data = load_digits()  # shipped inside scikit-learn: no download
        images = data.images / 16.0  # pixel intensities are integers 0..16
        # Two stratified cuts: test first, then val out of the rest, so each split keeps the class proportions.
        rest_x, test_x, rest_y, test_y = train_test_split(
            images, data.target, test_size=test_fraction, stratify=data.target, random_state=seed
        )
        train_x, val_x, train_y, val_y = train_test_split(
            rest_x, rest_y, test_size=val_fraction / (1.0 - test_fraction), stratify=rest_y, random_state=seed
        )
        self.splits = {
            "train": _split(train_x, train_y),
            "val": _split(val_x, val_y),
            "test": _split(test_x, test_y),
        }

    def baseline(self, split: str) -> dict[str, float]:
        """Accuracy on `split` of always answering the most frequent TRAIN class."""
        s = self.splits[split]
        return {"accuracy": majority_accuracy(self.splits["train"].targets, s.targets, s.weights)}
