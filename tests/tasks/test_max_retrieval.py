"""task=max_retrieval (Veličković et al. 2024): its labels against an independent decoding of the inputs, its
options, and the paper's one-head model learning it above chance."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from cli_helpers import compose_train
from flax import nnx

from attnlab import config
from attnlab.checks import ConfigError
from attnlab.config.assembly import assemble
from attnlab.run import chance


def decode(split, num_classes):
    """(query position, the winner's class) per example, read back from the token layout alone."""
    queries, winners = [], []
    for x in split.inputs.astype(np.float64):
        q = int(np.flatnonzero(x[:, num_classes + 1] == 1.0)[0])
        items = x[:q]
        assert (items[:, num_classes + 1] == 0).all() and np.allclose(items[:, 1 : num_classes + 1].sum(1), 1.0)
        queries.append(q)
        winners.append(int(np.argmax(items[int(np.argmax(items[:, 0])), 1 : num_classes + 1])))
    return np.array(queries), np.array(winners)


@pytest.mark.parametrize("n_items,min_items", [(6, None), (9, 2)])
def test_labels_are_the_class_of_the_highest_priority_item(n_items, min_items):
    task = config.task(
        "max_retrieval", n_items=n_items, min_items=min_items, num_classes=5, n_train=400, n_val=50, n_test=50, seed=3
    )
    assert task.seq_len == n_items + 1 and task.input_dim == 7 and task.num_classes == 5
    for split in task.splits.values():
        q, winner = decode(split, 5)
        sizes = q  # the query follows the items
        assert sizes.min() >= (min_items or n_items) and sizes.max() <= n_items
        rows = np.arange(len(split))
        np.testing.assert_array_equal(split.targets[rows, q], winner)
        expected_w = np.zeros(split.weights.shape, np.float32)
        expected_w[rows, q] = 1.0
        np.testing.assert_array_equal(split.weights, expected_w)
        np.testing.assert_array_equal(split.valid, np.arange(task.seq_len)[None] <= q[:, None])
        assert ((split.inputs[..., 0] >= 0) & (split.inputs[..., 0] < 1)).all()
    if min_items is not None:  # sizes cover the whole range
        assert set(decode(task.splits["train"], 5)[0]) == set(range(min_items, n_items + 1))
    winners = decode(task.splits["train"], 5)[1]
    assert np.bincount(winners, minlength=5).min() > 400 / 5 * 0.6  # the winner's class is uniform
    assert task.baseline("test") == {"accuracy": 0.2}


def test_the_split_does_not_change_with_n_train_and_seeds_differ():
    a = config.task("max_retrieval", n_items=5, n_train=100, n_val=20, n_test=20)
    b = config.task("max_retrieval", n_items=5, n_train=300, n_val=20, n_test=20)
    c = config.task("max_retrieval", n_items=5, n_train=100, n_val=20, n_test=20, seed=1)
    np.testing.assert_array_equal(a.splits["test"].inputs, b.splits["test"].inputs)
    assert not np.array_equal(a.splits["test"].inputs, c.splits["test"].inputs)


@pytest.mark.parametrize(
    "options,key",
    [
        ({"n_items": 0}, "task.n_items"),
        ({"min_items": 0}, "task.min_items"),
        ({"n_items": 4, "min_items": 5}, "task.min_items=5"),
        ({"num_classes": 1}, "task.num_classes"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, key):
    with pytest.raises(ConfigError, match=rf"{key}.*allowed"):
        config.task("max_retrieval", n_train=10, n_val=5, n_test=5, **options)


def test_one_head_between_mlps_learns_it_above_chance():
    """The README's model (one layer, one head, no positions) trained 250 Adam steps in-process on 8 items,
    4 classes: test accuracy past the binomial 97.5% point of chance (0.25)."""
    cfg = compose_train(
        "model=tiny",
        "task=max_retrieval",
        "model.layers=1",
        "model.heads=1",
        "model.positional=none",
        "task.n_items=8",
        "task.num_classes=4",
        "task.n_train=4000",
        "task.n_test=500",
    )
    task, (net,), _, _ = assemble(cfg, "softmax_ce")
    graphdef, params, rest = nnx.split(net, nnx.Param, ...)
    tx = optax.adam(3e-3)
    train, test = task.splits["train"], task.splits["test"]

    def logits(p, s):
        n = nnx.merge(graphdef, p, rest)
        return n.head(n.body(s["inputs"], s["valid"])[0])

    def loss(p, s):
        return net.head.loss(logits(p, s), s["targets"], s["weights"])

    @jax.jit
    def step(p, opt, s):
        value, g = jax.value_and_grad(loss)(p, s)
        updates, opt = tx.update(g, opt, p)
        return optax.apply_updates(p, updates), opt, value

    opt, rng = tx.init(params), np.random.default_rng(0)
    for _ in range(250):
        idx = rng.integers(0, len(train), 64)
        params, opt, _ = step(
            params, opt, {k: jnp.asarray(getattr(train, k)[idx]) for k in ("inputs", "targets", "valid", "weights")}
        )
    out = np.asarray(jax.jit(logits)(params, {"inputs": test.inputs, "valid": test.valid}))
    rows, q = np.arange(len(test)), test.weights.argmax(1)
    accuracy = float(np.mean(out[rows, q].argmax(-1) == test.targets[rows, q]))
    assert accuracy > chance.threshold(0.25, len(test)) + 0.2, accuracy


def test_max_retrieval_sets_grow_to_the_test_length():
    task = config.task(
        "max_retrieval",
        n_items=6,
        min_items=3,
        num_classes=5,
        seed=2,
        n_train=60,
        n_val=20,
        n_test=30,
        test_lengths=[24],
    )
    split = task.at_lengths[24].splits["test"]
    assert split.inputs.shape == (30, 25, 7)
    q, winner = decode(split, 5)
    assert q.min() >= 3 and q.max() <= 24 and q.max() > 6
    rows = np.arange(len(split))
    np.testing.assert_array_equal(split.targets[rows, q], winner)
    assert (split.weights.sum(1) == 1).all() and (split.weights[rows, q] == 1).all()
