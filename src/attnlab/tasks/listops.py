"""ListOps (Nangia & Bowman 2018) as generated for Long Range Arena (Tay et al. 2021)."""

from __future__ import annotations

import types

import numpy as np

from attnlab.checks import ConfigError
from attnlab.options import tasks as task_options
from attnlab.tasks.base import Split, Task, disjoint_splits, majority_accuracy, split_sizes

# The generator's alphabet (google-research/long-range-arena lra_benchmarks/data/listops.py), pad first.
# LRA built its vocabulary from part of the validation split; we tokenise from the alphabet itself.
OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VOCAB = ("<pad>",) + tuple(str(d) for d in range(10)) + OPERATORS + (END,)
TOKEN_ID = {tok: i for i, tok in enumerate(VOCAB)}
PAD = 0
VALUE_P = 0.25  # LRA: a node is an operator with probability 0.25, a leaf digit otherwise


def apply_op(op: str, args: list[int]) -> int:
    """LRA's semantics: MIN, MAX, MED = int(np.median) (mean of the middle two if even), SM = sum mod 10."""
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        return int(np.median(args))
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"unknown operator {op!r}")


def generate_tree(uniform, depth: int, max_depth: int, max_args: int) -> tuple[list[str], int]:
    """(tokens, value) of a random expression, following LRA's generate_tree; `uniform()` draws from [0, 1)."""
    # LRA: r = random() below max depth, else 1 (a forced leaf); leaf if r > VALUE_P.
    if depth < max_depth and uniform() <= VALUE_P:
        num_args = 2 + int(uniform() * (max_args - 1))  # randint(2, max_args), inclusive
        tokens, args = [], []
        for _ in range(num_args):
            t, v = generate_tree(uniform, depth + 1, max_depth, max_args)
            tokens += t
            args.append(v)
        op = OPERATORS[int(uniform() * len(OPERATORS))]
        return [op] + tokens + [END], apply_op(op, args)
    value = int(uniform() * 10)
    return [str(value)], value


def to_string(row: np.ndarray) -> str:
    """The bracketed expression of one token row (padding dropped), e.g. ``[MAX 2 9 [MIN 4 7 ] 0 ]``."""
    return " ".join(VOCAB[int(t)] for t in row if int(t) != PAD)


class _Uniforms:
    """Scalar uniforms from a numpy Generator, drawn in blocks (per-call Generator overhead dominates otherwise)."""

    def __init__(self, rng: np.random.Generator, block: int = 1 << 16):
        self.rng, self.block, self.buf, self.i = rng, block, rng.random(block).tolist(), 0

    def __call__(self) -> float:
        if self.i == self.block:
            self.buf, self.i = self.rng.random(self.block).tolist(), 0
        self.i += 1
        return self.buf[self.i - 1]


class ListOps(Task):
    """Evaluate a nested prefix expression of MIN/MAX/MED/SM over digits; 10-way classification of the value."""

    kind = "classification"
    baseline_labels = {"accuracy": {"accuracy": "majority class"}}
    granularity = "sequence"
    no_length_reason = "its expressions' lengths follow max_depth and max_args, so a longer seq_len only adds padding"
    tiny_options = types.MappingProxyType(
        {"max_depth": 2, "max_args": 3, "min_length": 4, "max_length": 16, "seq_len": 16}
    )

    def __init__(
        self,
        max_depth: int = 3,
        max_args: int = 5,
        min_length: int = 10,
        max_length: int = 64,
        seq_len: int = 64,
        seed: int = 0,
        n_train: int = 10000,
        n_val: int = 1000,
        n_test: int = 1000,
        default_head: str = "softmax_ce",
        **shared,
    ):
        super().__init__(**shared)  # the options every task takes (Task.__init__)
        task_options.listops(
            max_depth=max_depth,
            max_args=max_args,
            min_length=min_length,
            max_length=max_length,
            seq_len=seq_len,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
        )
        self.max_depth, self.max_args, self.seq_len = int(max_depth), int(max_args), int(seq_len)
        self.min_length, self.max_length = int(min_length), int(max_length)
        self.vocab_size, self.input_dim, self.num_classes = len(VOCAB), None, 10
        self.default_head = default_head
        sizes = split_sizes(n_train, n_val, n_test)
        self.options = dict(
            max_depth=max_depth,
            max_args=max_args,
            min_length=min_length,
            max_length=max_length,
            seq_len=seq_len,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            default_head=default_head,
        )
        self.splits = disjoint_splits(self._sample, sizes, int(seed))

    def _sample(self, rng: np.random.Generator, n: int, max_tries_per_example: int = 1000) -> Split:
        """Draw n expressions whose length lies in [min_length, max_length] (rejection sampling, as in LRA)."""
        uniform = _Uniforms(rng)
        inputs = np.zeros((n, self.seq_len), dtype=np.int32)
        targets = np.zeros(n, dtype=np.int32)
        valid = np.zeros((n, self.seq_len), dtype=bool)
        got, tries = 0, 0
        while got < n:
            tries += 1
            if tries > max_tries_per_example * n:
                raise ConfigError(
                    f"min_length={self.min_length}..max_length={self.max_length} is almost never met with "
                    f"max_depth={self.max_depth}, max_args={self.max_args}; widen the range"
                )
            tokens, value = generate_tree(uniform, 1, self.max_depth, self.max_args)  # LRA starts at depth 1
            if self.min_length <= len(tokens) <= self.max_length:
                inputs[got, : len(tokens)] = [TOKEN_ID[t] for t in tokens]
                valid[got, : len(tokens)] = True
                targets[got] = value
                got += 1
        return Split(inputs, targets, np.ones(n, dtype=np.float32), valid)

    def expression(self, split: str, index: int) -> str:
        """The bracketed expression of one example."""
        return to_string(self.splits[split].inputs[index])

    def baseline(self, split: str) -> dict[str, float]:
        """Accuracy on `split` of always answering the most frequent TRAIN label."""
        s = self.splits[split]
        return {"accuracy": majority_accuracy(self.splits["train"].targets, s.targets, s.weights)}
