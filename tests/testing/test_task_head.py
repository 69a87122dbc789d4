"""The task and head contracts (attnlab.testing.check_task, check_head) over every registered task and head, and the
checkers against deliberately broken ones."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnlab import config, heads, tasks
from attnlab.checks import ConfigError
from attnlab.config import registry
from attnlab.testing import ContractViolation, check_head, check_task

SMALL = {"n_train": 300, "n_val": 60, "n_test": 60}


def small_task(name: str, **overrides) -> tasks.Task:
    """Task `name` with small split sizes where it has them, updated by the checker's overrides."""
    keys = registry.load("task", name)
    return config.task(name, **{**{k: v for k, v in SMALL.items() if k in keys}, **overrides})


@pytest.mark.parametrize("name", registry.choices("task"))
def test_shipped_task_meets_the_contract(name):
    check_task(functools.partial(small_task, name), name=name)


@pytest.mark.parametrize("name", registry.choices("head"))
def test_shipped_head_meets_the_contract(name):
    check_head(functools.partial(config.head, name), name=name)


# --- the checkers catch broken tasks and heads ----------------------------------------------------------------------


def _tiny(cls, **overrides):
    """A small MQAR-like task of class `cls`."""
    return cls(**{"seq_len": 16, "vocab_size": 16, "num_kv_pairs": 2, **SMALL, **overrides})


class _TestIsTrain(tasks.MQAR):
    """Its test split is the first rows of its train split."""

    def __init__(self, **options):
        super().__init__(**options)
        n = len(self.splits["test"])
        self.splits = {**self.splits, "test": self.splits["train"].take(np.arange(n))}


class _IgnoresSeed(tasks.MQAR):
    def __init__(self, seed=0, **options):
        super().__init__(seed=0, **options)


class _ChanceAboveOne(tasks.MQAR):
    def baseline(self, split):
        return {"accuracy": float("nan")}


@pytest.mark.parametrize(
    "cls,prop",
    [
        (_TestIsTrain, "disjoint splits: 60 input rows in both train and test at seed=3"),
        (_IgnoresSeed, "determinism by seed: train inputs equal at seeds 3 and 4"),
        (_ChanceAboveOne, "baselines: accuracy=nan is not a finite float >= 0 at seed=3 split=train"),
    ],
)
def test_the_task_checker_names_the_broken_property(cls, prop):
    make = functools.partial(_tiny, cls)
    with pytest.raises(ContractViolation) as info:
        check_task(make, name="broken")
    assert str(info.value) == f"task=broken: {prop}", str(info.value)


def test_a_task_whose_test_split_changes_with_n_train_breaks_its_test_lengths():
    class Redrawn(tasks.MQAR):
        def __init__(self, **options):
            super().__init__(**options)
            if self.options["n_train"] == 1:  # a test split drawn after train would change with n_train
                test = self.splits["test"]
                self.splits = {**self.splits, "test": test.take(np.arange(len(test))[::-1])}

    with pytest.raises(ContractViolation, match=r"^task=redrawn: test lengths: test inputs change when n_train"):
        check_task(functools.partial(_tiny, Redrawn), name="redrawn")


class _SoftmaxInside(heads.SoftmaxCE):
    def __call__(self, features_XD):
        return jax.nn.softmax(self.proj(features_XD), -1)


class _PlainMean(heads.MSE):
    """Averages over every position, weight or not."""

    def loss(self, outputs_X, targets_X, weights_X):
        return jnp.mean((outputs_X - self._targets(targets_X, weights_X)) ** 2)


class _TakesAnyClasses(heads.MSE):
    def __init__(self, *, d_model, num_classes, rngs):
        super().__init__(d_model=d_model, num_classes=None, rngs=rngs)


@pytest.mark.parametrize(
    "cls,prop",
    [
        (_SoftmaxInside, "activation: outputs are not affine in the features"),
        (_PlainMean, "weighted mean: loss"),
        (_TakesAnyClasses, "construction: a regression head built with num_classes=5"),
    ],
)
def test_the_head_checker_names_the_broken_property(cls, prop):
    with pytest.raises(ContractViolation) as info:
        check_head(cls, name="broken")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"head=broken: {prop}"), msg


def test_a_task_taking_odd_lengths_only_is_checked_at_a_longer_odd_length():
    class OddLengths(tasks.MQAR):
        def __init__(self, **options):
            if options["seq_len"] % 2 == 0:
                raise ConfigError(f"task.seq_len={options['seq_len']} is invalid; allowed: an odd integer")
            super().__init__(**options)

    check_task(functools.partial(_tiny, OddLengths, seq_len=15), name="odd")
