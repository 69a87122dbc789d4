"""Pure, jitted train and eval steps over (graphdef, state); no config objects, no host syncs."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attnlab.backends import sampled_rows
from attnlab.model import Net
from attnlab.model.groups import GRAD_NORMS, in_grad_norm
from attnlab.optim import current_lr
from attnlab.tasks.batches import key_at


def grad_norms(grads, groups, layers, num_layers) -> jax.Array:
    """(len(GRAD_NORMS) + num_layers,) the gradient norms GRAD_NORMS names, then one per layer, from one reduction
    over every leaf. One vector, read on the host: a scalar output per norm is a kernel per norm on a GPU."""
    sq_leaf = leaf_sums(jax.tree.leaves(grads), lambda g: jnp.square(g.astype(jnp.float32)))
    picks = [[in_grad_norm(name, g) for g in groups] for name in GRAD_NORMS]
    picks += [[layer == i for layer in layers] for i in range(num_layers)]
    # One masked row sum for every norm: a (norms, leaves) selection, not a reduction per norm.
    return jnp.sqrt(jnp.where(np.array(picks), sq_leaf[None, :], 0.0).sum(-1))


# Leaves are summed as rows of this many elements: wide enough for a GPU row reduction, small enough
# that padding the many small leaves (biases, scales, β) costs nothing.
SUM_ROW = 1024


def leaf_sums(leaves, fn) -> jax.Array:
    """(leaves,) Σ fn(leaf) of each leaf, by one row reduction over all of them and one sorted segment sum.

    A reduction per leaf is a kernel per leaf on a GPU; here every leaf is ravelled into zero-padded
    rows of SUM_ROW (fn(0) must be 0), the rows are concatenated and summed, and the row sums are added
    up by leaf.
    """
    rows, leaf_of_row = [], []
    for i, leaf in enumerate(leaves):
        flat = fn(leaf).ravel()
        n_rows = -(-flat.size // SUM_ROW)
        rows.append(jnp.pad(flat, (0, n_rows * SUM_ROW - flat.size)).reshape(n_rows, SUM_ROW))
        leaf_of_row += [i] * n_rows
    row_sums = jnp.concatenate(rows).sum(-1)
    return jax.ops.segment_sum(row_sums, np.array(leaf_of_row), num_segments=len(leaves), indices_are_sorted=True)


# Leaves per finiteness reduction: a group's update is fused into its reduction only while the fusion's
# operands (four per leaf: gradient, two moments, parameter) stay within XLA:GPU's operand limit; at 93
# leaves in one group every leaf's update became a kernel of its own; groups of 16 fuse, of 24 do not
# (measured, deviceless H100 compile of the model=base step).
FINITE_GROUP = 16


def all_finite(leaves) -> jax.Array:
    """Whether every element of every leaf is finite: one reduction per group of FINITE_GROUP leaves' concatenation."""
    groups = [leaves[i : i + FINITE_GROUP] for i in range(0, len(leaves), FINITE_GROUP)]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(jnp.concatenate([x.ravel() for x in group]))) for group in groups]))


def probes_per_layer(net: Net) -> tuple[bool, ...]:
    """Per layer: whether its normalizer exposes its score matrix to a gradient probe (score_grad)."""
    return tuple(block.attn.normalizer.exposes_scores for block in net.body.blocks)


def step_key(state):
    """The step's PRNG key: a function of the seed and the step only, so a resumed run replays it."""
    return key_at(state["key"], state["step"])


def sample_batch(data, key, batch_size):
    """The training batch of a step, drawn on device from the task's training data (Task.batches: a split's
    rows, a text's windows, or the windows the host gathered for this step; attnlab.tasks.batches)."""
    return data.draw(key, batch_size)


def over_seeds(fn, num_seeds: int, in_axes: tuple):
    """vmap `fn` over the leading seed axis; with one seed, index it away instead (a size-1 vmap costs
    ~7% on CPU in extra transposes; BENCHMARKS.md)."""
    if num_seeds > 1:
        return jax.vmap(fn, in_axes=in_axes)

    def single(*args):
        args = [jax.tree.map(lambda x: x[0], a) if ax == 0 else a for a, ax in zip(args, in_axes)]
        return jax.tree.map(lambda x: x[None], fn(*args))

    return single


def scored(feats, batch, k: int | None):
    """(features, targets, weights) at the k positions per example that carry weight, in order (k from
    Task.scored_positions; None: every position). A task scoring k of T positions (MQAR: its queries)
    pays the head and loss for k, not T (zoology computes all T and ignores most); exact, since a
    position of weight 0 adds nothing to any loss or metric sum."""
    if k is None:
        return feats, batch["targets"], batch["weights"]
    w_BT = batch["weights"]
    T = w_BT.shape[1]
    order_BT = jnp.where(w_BT > 0, (T - jnp.arange(T))[None, :], 0)  # weighted positions first, earliest first
    idx_BK = jax.lax.top_k(order_BT, k)[1]
    take = lambda a: jnp.take_along_axis(a, idx_BK.reshape(idx_BK.shape + (1,) * (a.ndim - 2)), axis=1)  # noqa: E731
    return take(feats), take(batch["targets"]), take(w_BT)


def loss_of_batch(graphdef, state, batch, key, *, with_stats: bool, scored_k: int | None = None):
    """(params, probes) -> (loss, stats) on `batch` with the step's dropout key (one definition for both steps)."""

    def loss_fn(params, probes):
        net = nnx.merge(graphdef, params, state["rest"])
        feats, stats = net.body(
            batch["inputs"],
            batch["valid"],
            with_stats=with_stats,
            score_probes=probes,
            deterministic=False,
            rngs=nnx.Rngs(dropout=jax.random.fold_in(key, 1)),
        )
        feats, targets, weights = scored(feats, batch, scored_k)
        return net.head.loss(net.head(feats), targets, weights), stats

    return loss_fn


def batch_sampler(batch_size, batch_sharding):
    """(data, key) -> the step's batch, sharded over the batch axis when asked."""

    def sample(data, key):
        batch = sample_batch(data, key, batch_size)
        return jax.lax.with_sharding_constraint(batch, batch_sharding) if batch_sharding else batch

    return sample


def make_train_step(
    graphdef,
    tx,
    *,
    groups,
    layers,
    num_layers,
    num_heads,
    batch_size,
    batch_sharding,
    num_seeds: int = 1,
    scored_k: int | None = None,
    data_axis: int | None = None,
):
    """Jitted (state, data) -> (state, metrics), vmapped over a leading seed axis of the state.

    state = {params, rest (non-trainable variables), opt_state, step, key (raw key data), nonfinite,
    first_nonfinite}; several seeds train as one compiled program (trainer.vmap_seeds). Logging steps
    run this same program: their statistics come from `make_stats_step`, which never feeds the update,
    so the parameters do not depend on trainer.log_every (tests/train/test_phases.py). `data` is shared by the
    seeds (data_axis None) or, from the host stream, one batch of windows per seed (data_axis 0).
    """
    sample = batch_sampler(batch_size, batch_sharding)
    tx = optax.with_extra_args_support(tx)  # any optax transformation; attnlab's clip reads grad_norm=

    def step(state, data):
        key = step_key(state)
        batch = sample(data, key)
        loss_fn = loss_of_batch(graphdef, state, batch, key, with_stats=False, scored_k=scored_k)
        (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], None)
        norm_K = grad_norms(grads, groups, layers, num_layers)
        global_norm = norm_K[GRAD_NORMS.index("global")]
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"], grad_norm=global_norm)
        params = optax.apply_updates(state["params"], updates)
        # A non-finite step leaves parameters and optimizer state untouched and is counted; the
        # host reads the count on logging steps (no per-step sync) and applies the policy. The updated
        # parameters are checked too: a finite gradient times a huge learning rate can overflow them.
        # They are checked on a second evaluation of the update from the gradients behind an optimization
        # barrier, so XLA keeps it apart: the kept update then fuses with the keep/revert select, writing
        # parameters and moments in one pass as an unguarded optax step (else the select is a pass of its
        # own). Only the gradients pass the barrier: every value of the check derives from them, and a
        # donated parameter or moment through it is copied first (its buffer is rewritten by the kept update).
        checked_grads = jax.lax.optimization_barrier(grads)
        check_updates, _ = tx.update(checked_grads, state["opt_state"], state["params"], grad_norm=global_norm)
        new_ok = all_finite(jax.tree.leaves(optax.apply_updates(state["params"], check_updates)))
        ok = jnp.isfinite(loss) & jnp.isfinite(global_norm) & new_ok
        keep = functools.partial(jax.tree.map, lambda new, old: jnp.where(ok, new, old))
        first_bad = jnp.where((state["first_nonfinite"] < 0) & ~ok, state["step"], state["first_nonfinite"])
        new_state = {
            "params": keep(params, state["params"]),
            "rest": state["rest"],
            "opt_state": keep(opt_state, state["opt_state"]),
            "step": state["step"] + 1,
            "key": state["key"],
            "nonfinite": state["nonfinite"] + (~ok),
            "first_nonfinite": first_bad,
        }
        # The group/layer norms come from the leaf sums of the global norm, read on logging steps only.
        metrics: dict[str, Any] = {
            "loss": loss,
            "nonfinite": new_state["nonfinite"],
            "grad_norm": norm_K,
            "first_nonfinite": first_bad,
            "lr": current_lr(opt_state),
        }
        return new_state, metrics

    return jax.jit(over_seeds(step, num_seeds, (0, data_axis)), donate_argnums=0)


def make_stats_step(
    graphdef,
    *,
    num_layers,
    num_heads,
    batch_size,
    batch_sharding,
    probe_layers: tuple[bool, ...],
    num_seeds: int = 1,
    scored_k: int | None = None,
    data_axis: int | None = None,
):
    """Jitted (state, data) -> statistics of the step `state` is about to take: attention statistics and
    dL/dz at the scores, from a separate forward (and a backward to the probes only: no weight gradients)
    on the same batch and dropout key, for the layers `probe_layers` marks (probes_per_layer; NaN rows for the
    others). It returns no state: the update always comes from `make_train_step`, whose metrics carry the gradient
    norms.
    """
    sample = batch_sampler(batch_size, batch_sharding)

    def stats(state, data):
        key = step_key(state)
        batch = sample(data, key)
        T = batch["valid"].shape[1]
        loss_fn = loss_of_batch(graphdef, state, batch, key, with_stats=True, scored_k=scored_k)
        # No B×N×T×T probe at length: the statistics stay blockwise and score_grad is not logged.
        if not any(probe_layers) or sampled_rows.at_length(T, T):
            return {"attn": loss_fn(state["params"], None)[1]}
        probes = [jnp.zeros((batch_size, num_heads, T, T)) if p else None for p in probe_layers]
        (_, attn), probe_grads = jax.value_and_grad(loss_fn, argnums=1, has_aux=True)(state["params"], probes)
        nan_N = jnp.full((num_heads,), jnp.nan)
        norms = [nan_N if g is None else jnp.sqrt(jnp.sum(jnp.square(g), (0, 2, 3))) for g in probe_grads]
        return {"attn": attn, "score_grad": jnp.stack(norms)}

    return jax.jit(over_seeds(stats, num_seeds, (0, data_axis)))


def make_maps(graphdef, num_seeds: int = 1):
    """(params, rest, inputs, valid) -> (L,B,N,T,S) attention matrices, vmapped over seeds."""
    maps = lambda params, rest, inputs, valid: nnx.merge(graphdef, params, rest).body.attention_maps(inputs, valid)  # noqa: E731
    return jax.jit(over_seeds(maps, num_seeds, (0, 0, None, None)))
