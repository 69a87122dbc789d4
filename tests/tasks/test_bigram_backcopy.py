"""task=bigram_backcopy (Guo et al. 2024): the generating process checked against its definition, its baselines against
a float64 hand computation, and its row groups."""

from __future__ import annotations

import collections
import functools
import math

import jax
import numpy as np
import pytest
from scipy import stats

from attnlab import config
from attnlab.checks import ConfigError
from attnlab.tasks.base import Split
from attnlab.tasks.batches import Rows, key_at
from attnlab.tasks.lm import corpus
from attnlab.testing import check_task

SMALL = dict(n_train=300, n_val=60, n_test=60)


@functools.lru_cache(maxsize=None)
def built(**options) -> object:
    return config.task("bigram_backcopy", **{**SMALL, **options})


def tokens(task, split):
    """(inputs as tokens with <s> = -1, targets) of a split (its name, or the Split)."""
    s = task.splits[split] if isinstance(split, str) else split
    x = s.inputs.astype(np.int64) - 1
    x[s.inputs == task.bos] = -1
    return x, s.targets.astype(np.int64)


@pytest.mark.parametrize(
    "options",
    [{}, {"transitions": "bytes"}, {"num_tokens": 5, "num_triggers": 2, "seq_len": 12, "dirichlet_alpha": 1.0}],
)
def test_every_trigger_is_followed_by_a_copy_of_the_token_before_it(options):
    task = built(**options)
    for split in ("train", "val", "test"):
        x, y = tokens(task, split)
        trigger = np.isin(x, task.triggers)
        assert trigger.any()
        assert not trigger[:, :2].any()  # x_0 is <s>, x_1 is no trigger
        n, t = np.nonzero(trigger)
        np.testing.assert_array_equal(y[n, t], x[n, t - 1])  # the target copies the token before the trigger
        # No two triggers are adjacent, so the copied token is never a trigger.
        assert not (trigger[:, 1:] & trigger[:, :-1]).any()
        # The same rows are the task's own trigger group.
        np.testing.assert_array_equal(task.row_groups(task.splits[split].inputs)["trigger"], trigger)


@pytest.mark.parametrize("options", [{}, {"transitions": "bytes"}])
def test_the_first_token_after_bos_is_never_a_trigger(options):
    task = built(**options)
    for split in ("train", "val", "test"):
        s = task.splits[split]
        assert (s.inputs[:, 0] == task.bos).all() and not (s.inputs[:, 1:] == task.bos).any()
        assert not np.isin(s.targets[:, 0], task.triggers).any()
        np.testing.assert_array_equal(s.inputs[:, 1], s.targets[:, 0] + 1)  # inputs are the targets shifted by one


def test_triggers_are_the_most_frequent_tokens_of_the_stationary_distribution():
    task = built(num_triggers=4)
    P, pi = task.transition, task.stationary
    np.testing.assert_allclose(P.sum(1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(pi @ P, pi, rtol=0, atol=1e-12)
    assert set(task.triggers) == set(np.argsort(pi)[-4:])
    assert pi[task.triggers].min() > np.delete(pi, task.triggers).max()
    first = np.where(np.isin(np.arange(task.num_tokens), task.triggers), 0.0, pi)
    np.testing.assert_allclose(task.first, first / first.sum(), rtol=1e-12)


def test_byte_transitions_are_the_corpus_byte_bigrams():
    """transitions=bytes: the V most frequent bytes of the lm corpus, their bigram counts (a cycle over the text with
    the other bytes removed), triggers the most frequent bytes — counted here with collections.Counter."""
    task = built(transitions="bytes", num_tokens=40)
    docs, _ = corpus.pydoc_topics()
    text = corpus.SEPARATOR.join(docs)
    kept = sorted(b for b, _ in sorted(collections.Counter(text).items(), key=lambda kv: (-kv[1], kv[0]))[:40])
    assert list(task.symbols) == kept
    filtered = bytes(b for b in text if b in set(kept))
    pairs = collections.Counter(zip(filtered, filtered[1:] + filtered[:1]))
    i, j = kept.index(ord("e")), kept.index(ord(" "))
    row = sum(c for (a, _), c in pairs.items() if a == ord("e"))
    assert task.transition[i, j] == pytest.approx(pairs[(ord("e"), ord(" "))] / row, rel=1e-12)
    assert bytes(task.symbols[task.triggers]) == b" et"  # English: space, e, t
    np.testing.assert_allclose(task.stationary @ task.transition, task.stationary, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "options", [{"num_tokens": 6, "dirichlet_alpha": 0.5}, {"transitions": "bytes", "num_tokens": 6}]
)
def test_non_trigger_transitions_follow_the_chain_rows(options):
    """Chi-square per row over a large sample: the successors of every non-trigger token, and the first token, are
    drawn from the chain's row (and the first-token distribution)."""
    task = built(**options, seq_len=64, n_train=3000)
    assert_rows_follow_the_chain(task, *tokens(task, "train"))


def assert_rows_follow_the_chain(task, x, y):
    """Chi-square per non-trigger token's successors against its row of P, and of the first token against its law."""
    V = task.num_tokens
    for a in range(V):
        rows = x == a
        if a in task.triggers:
            continue
        observed = np.bincount(y[rows], minlength=V)
        expected = task.transition[a] * observed.sum()
        assert observed.sum() > 500
        assert (observed[expected == 0] == 0).all()
        keep = expected > 0
        p = stats.chisquare(observed[keep], expected[keep]).pvalue
        assert p > 1e-4, f"token {a}: successors {observed}, expected {np.round(expected)}"
    first = np.bincount(y[:, 0], minlength=V)
    keep = task.first > 0
    assert (first[~keep] == 0).all()
    assert stats.chisquare(first[keep], task.first[keep] * first.sum()).pvalue > 1e-4


def fresh(task, n: int, step: int = 0, seed: int = 0) -> Split:
    """The n sequences task.fresh draws at state step `step` of seed `seed` (the train step's key, steps.step_key)."""
    key = key_at(jax.random.key_data(jax.random.key(seed)), step)
    return Split(**jax.tree.map(np.asarray, jax.device_put(task.batches(n)).draw(key, n)))  # as the loop places it


@pytest.mark.parametrize(
    "options", [{"num_tokens": 6, "dirichlet_alpha": 0.5}, {"transitions": "bytes", "num_tokens": 6}]
)
def test_fresh_sequences_follow_the_process(options):
    """task.fresh: <s> then the chain (chi-square per row, and the first token), each trigger followed by a copy."""
    task = built(**options, seq_len=64, fresh=True)
    s = fresh(task, 3000)
    assert s.inputs.dtype == s.targets.dtype == np.int32 and s.weights.all() and s.valid.all()
    assert (s.inputs[:, 0] == task.bos).all() and not (s.inputs[:, 1:] == task.bos).any()
    np.testing.assert_array_equal(s.inputs[:, 1:], s.targets[:, :-1] + 1)  # the inputs are the targets shifted
    x, y = tokens(task, s)
    n, t = np.nonzero(np.isin(x, task.triggers))
    assert len(n) > 1000 and t.min() >= 2
    np.testing.assert_array_equal(y[n, t], x[n, t - 1])
    assert_rows_follow_the_chain(task, x, y)


def test_fresh_batches_are_new_each_step_and_the_same_again_at_a_step():
    task = built(fresh=True)
    at_3 = fresh(task, 64, step=3)
    np.testing.assert_array_equal(fresh(task, 64, step=3).inputs, at_3.inputs)  # a resumed run draws the same
    assert (fresh(task, 64, step=4).inputs != at_3.inputs).any()
    assert (fresh(task, 64, step=3, seed=1).inputs != at_3.inputs).any()
    assert isinstance(built().batches(8), Rows)  # by default, rows of the fixed train split


def test_bayes_optimal_losses_equal_a_hand_computation():
    task = built(num_tokens=4, num_triggers=1, seq_len=6, n_train=40, n_val=20, n_test=12, dirichlet_alpha=1.0)
    x, y = tokens(task, "test")
    P, first, trig = task.transition, task.first, set(task.triggers.tolist())
    dormant, all_rows, hits = [], [], []
    for n in range(len(x)):
        for t in range(task.seq_len):
            if x[n, t] == -1:
                nll = -math.log(first[y[n, t]])
                hits.append(int(y[n, t]) == int(np.argmax(first)))
            elif int(x[n, t]) in trig:
                assert y[n, t] == x[n, t - 1]
                all_rows.append(0.0)
                continue
            else:
                nll = -math.log(P[x[n, t], y[n, t]])
                hits.append(int(y[n, t]) == int(np.argmax(P[x[n, t]])))
            dormant.append(nll)
            all_rows.append(nll)
    base = task.baseline("test")
    assert len(dormant) < len(all_rows)  # some trigger rows
    assert base["dormant/loss"] == pytest.approx(sum(dormant) / len(dormant), rel=1e-12)
    assert base["loss"] == pytest.approx(sum(all_rows) / len(all_rows), rel=1e-12)
    assert base["dormant/accuracy"] == pytest.approx(sum(hits) / len(hits), rel=1e-12)
    assert base["trigger/loss"] == 0.0 and base["trigger/accuracy"] == 1.0


def test_unigram_and_bigram_baselines_lie_between_chance_and_bayes():
    task = built()
    base = task.baseline("test")
    V = task.num_tokens
    assert base["dormant/loss"] < base["dormant/loss_bigram"] < base["dormant/loss_unigram"] < math.log(V) + 0.05
    assert base["loss"] < base["loss_bigram"] < base["loss_unigram"]
    assert base["accuracy"] < base["accuracy_bigram"] < base["accuracy_bayes"]
    # The fitted bigram predictor cannot copy: on trigger rows it is far from the Bayes-optimal 0.
    assert base["trigger/loss_bigram"] > 1.0 and base["trigger/accuracy_bigram"] < 0.5
    labels = task.baseline_labels
    assert {k for refs in labels.values() for k in refs} <= set(base)
    assert task.plateaus()["test/accuracy"]["majority token"] == base["accuracy"]


def test_row_groups_partition_the_valid_rows():
    task = built()
    for split in ("train", "test"):
        s = task.splits[split]
        g = task.row_groups(s.inputs)
        assert set(g) == {"trigger", "dormant"}
        assert not (g["trigger"] & g["dormant"]).any()
        np.testing.assert_array_equal(g["trigger"] | g["dormant"], s.valid)
        assert g["dormant"][:, 0].all()  # the <s> row is dormant
        share = g["trigger"].mean()
        assert 0.02 < share < 0.3
    padded = task.splits["test"].inputs[:2].copy()
    padded[:, -3:] = 0
    g = task.row_groups(padded)
    assert not (g["trigger"] | g["dormant"])[:, -3:].any()


def test_splits_are_disjoint_and_deterministic_by_seed():
    a, again, other = built(seed=5), config.task("bigram_backcopy", **SMALL, seed=5), built(seed=6)
    rows = {s: {r.tobytes() for r in a.splits[s].inputs} for s in a.splits}
    assert not (rows["train"] & rows["val"]) and not (rows["train"] & rows["test"]) and not (rows["val"] & rows["test"])
    for s in ("train", "val", "test"):
        for f in ("inputs", "targets", "weights", "valid"):
            np.testing.assert_array_equal(getattr(a.splits[s], f), getattr(again.splits[s], f))
        assert not np.array_equal(a.splits[s].inputs, other.splits[s].inputs)
    assert not np.allclose(a.transition, other.transition)  # the Dirichlet chain is seeded too
    np.testing.assert_array_equal(built(transitions="bytes", seed=1).transition, built(transitions="bytes").transition)


def test_test_lengths_keep_the_chain_and_the_fitted_baselines():
    task = built()
    (at,) = config.task("bigram_backcopy", **SMALL, test_lengths=[128]).at_lengths.values()
    assert at.seq_len == 128 and at.splits["test"].inputs.shape == (SMALL["n_test"], 128)
    np.testing.assert_array_equal(at.transition, task.transition)
    np.testing.assert_array_equal(at.bigram, task.bigram)  # not refitted on the rebuild's one-example train split
    x, y = tokens(at, "test")
    n, t = np.nonzero(np.isin(x, at.triggers))
    np.testing.assert_array_equal(y[n, t], x[n, t - 1])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"transitions": "trigram"}, "dirichlet | bytes"),
        ({"transitions": "bytes", "num_tokens": 250}, "distinct bytes"),
        ({"num_triggers": 64}, "num_triggers"),
        ({"dirichlet_alpha": 0.0}, "dirichlet_alpha"),
        ({"num_tokens": 1}, "num_tokens"),
        ({"fresh": "yes"}, "task.fresh='yes' is invalid; allowed: true or false"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, message):
    with pytest.raises(ConfigError, match=message):
        config.task("bigram_backcopy", **SMALL, **options)


def test_byte_transitions_meet_the_task_contract():
    check_task(functools.partial(config.task, "bigram_backcopy", **SMALL, transitions="bytes"), name="bigram_backcopy")
