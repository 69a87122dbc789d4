"""steps.scored: the head and loss on the k weighted positions per example equal those on all T positions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_helpers import compose_train, tiny_task
from flax import nnx

from attnlab import config
from attnlab.config.assembly import assemble
from attnlab.steps import loss_of_batch, scored


def test_scored_takes_exactly_the_weighted_positions_in_order():
    rng = np.random.default_rng(0)
    B, T, D, k = 6, 12, 3, 4
    w_BT = np.zeros((B, T), np.float32)
    for b in range(B):  # 0..k weighted positions per row, with weights that are not all 1
        w_BT[b, rng.choice(T, rng.integers(0, k + 1), replace=False)] = rng.uniform(0.5, 2.0)
    feats = rng.normal(size=(B, T, D)).astype(np.float32)
    batch = {"targets": rng.integers(0, 9, (B, T)), "weights": w_BT}
    f, y, w = map(np.asarray, scored(jnp.asarray(feats), jax.tree.map(jnp.asarray, batch), k))
    assert f.shape == (B, k, D) and y.shape == w.shape == (B, k)
    for b in range(B):
        (pos,) = np.nonzero(w_BT[b])
        n = len(pos)
        np.testing.assert_array_equal(f[b, :n], feats[b, pos])
        np.testing.assert_array_equal(y[b, :n], batch["targets"][b, pos])
        np.testing.assert_array_equal(w[b, :n], w_BT[b, pos])
        assert (w[b, n:] == 0).all()  # the filler positions weigh nothing


def test_scored_positions_of_the_tasks():
    assert (
        config.task(
            "mqar", seq_len=32, vocab_size=32, num_kv_pairs=3, n_train=50, n_val=10, n_test=10
        ).scored_positions()
        == 3
    )
    assert config.task("lm", seq_len=16, n_train=10, n_val=4, n_test=4).scored_positions() is None  # every position
    assert config.task("listops", seq_len=64, n_train=10, n_val=4, n_test=4).scored_positions() is None  # per sequence


@pytest.mark.parametrize("head", ["softmax_ce", "scores_mse"])
def test_loss_and_gradients_on_scored_positions_equal_those_on_every_position(head):
    cfg = compose_train("model=tiny", "task=mqar", *tiny_task("mqar"), f"head={head}")
    task, nets, tx, _ = assemble(cfg, head)
    k = task.scored_positions()
    assert k == 2
    graphdef, params, rest = nnx.split(nets[0], nnx.Param, ...)
    state = {"rest": rest}
    s = task.splits["train"]
    batch = {n: jnp.asarray(getattr(s, n)[:32]) for n in ("inputs", "targets", "weights", "valid")}
    key = jax.random.key(0)
    full = jax.value_and_grad(loss_of_batch(graphdef, state, batch, key, with_stats=False), has_aux=True)
    part = jax.value_and_grad(loss_of_batch(graphdef, state, batch, key, with_stats=False, scored_k=k), has_aux=True)
    (l_full, _), g_full = full(params, None)
    (l_part, _), g_part = part(params, None)
    np.testing.assert_allclose(float(l_part), float(l_full), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_part), jax.tree.leaves(g_full)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
