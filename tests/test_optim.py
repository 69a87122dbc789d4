"""attnlab.optim: the schedule against its closed form, the decay mask, the clip that takes the step's norm, and
the chains' updates against optax's own AdamW and SGD."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from attnlab.normalizers import NormalizerParam
from attnlab.optim import SGD, AdamW, clip_by_global_norm, current_lr, decay_mask, schedule


@pytest.mark.parametrize("lr, warmup, total, final", [(1e-3, 2, 8, 0.5), (3e-2, 0, 5, 0.1), (1.0, 10, 10, 0.0)])
def test_schedule_is_linear_warmup_then_cosine_to_the_final_fraction(lr, warmup, total, final):
    count = np.arange(total + 3)
    w, t = max(warmup, 1), max(total, warmup + 1)
    progress = np.clip((count - w) / (t - w), 0.0, 1.0)
    cosine = final * lr + (1 - final) * lr * 0.5 * (1 + np.cos(np.pi * progress))
    want = np.where(count < w, lr * count / w, cosine)
    got = [float(schedule(lr, warmup, total, final)(c)) for c in count]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


class _Toy(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones((3, 4)))
        self.b = nnx.Param(jnp.ones((4,)))
        self.beta = NormalizerParam(jnp.ones((2, 2)))  # 2-D, yet a normalizer parameter: never decayed


def test_decay_mask_decays_weight_matrices_only():
    params = nnx.state(_Toy(), nnx.Param)
    mask = decay_mask(params)
    assert (mask["w"], mask["b"], mask["beta"]) == (True, False, False)


def _leaves(seed):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=s) * 10.0 ** rng.integers(-3, 3), jnp.float32) for s in [(3,), (37, 61), (8,)]]


def test_clip_with_the_steps_norm_is_optaxs_clip():
    xs = _leaves(3)
    for max_norm in (1e-2, 1e6):  # clipped, and left alone
        want, _ = optax.clip_by_global_norm(max_norm).update(xs, optax.EmptyState())
        ours = clip_by_global_norm(max_norm)
        given, _ = ours.update(xs, ours.init(xs), grad_norm=optax.tree.norm(xs))
        alone, _ = ours.update(xs, ours.init(xs))
        for a, b, c in zip(want, given, alone):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)


def test_the_chain_is_clip_then_optax_adamw_with_the_mask_and_schedule():
    """Three updates of AdamW(...)(params, total_steps) against optax's clip + adamw built from the same values."""
    opts = dict(lr=1e-2, warmup_steps=1, weight_decay=0.1, clip_norm=0.5, b1=0.9, b2=0.99, final_fraction=0.2)
    params = nnx.state(_Toy(), nnx.Param)
    ours = AdamW(**opts)(params, total_steps=3)
    sched = schedule(opts["lr"], opts["warmup_steps"], 3, opts["final_fraction"])
    theirs = optax.chain(
        optax.clip_by_global_norm(opts["clip_norm"]),
        optax.adamw(sched, b1=opts["b1"], b2=opts["b2"], weight_decay=opts["weight_decay"], mask=decay_mask(params)),
    )
    p_ours = p_theirs = params
    s_ours, s_theirs = ours.init(params), theirs.init(params)
    for step in range(3):
        grads = jax.tree.map(lambda x, step=step: jnp.full_like(x, 0.3 * (step + 1)) + x, p_ours)
        u_ours, s_ours = ours.update(grads, s_ours, p_ours)
        u_theirs, s_theirs = theirs.update(grads, s_theirs, p_theirs)
        p_ours, p_theirs = optax.apply_updates(p_ours, u_ours), optax.apply_updates(p_theirs, u_theirs)
        for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(p_theirs)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(current_lr(s_ours), sched(step), rtol=1e-6)


def test_sgd_is_optax_sgd_with_momentum_after_the_clip_and_decays_only_weight_matrices():
    """Three updates of SGD(...)(params, total_steps) against optax's clip + (masked decay, sgd) with the schedule."""
    params = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]]), "b": jnp.array([0.3, -0.1])}
    opts = dict(lr=0.1, warmup_steps=1, clip_norm=0.5, final_fraction=0.2, momentum=0.9, weight_decay=0.01)
    ours = SGD(**opts)(params, total_steps=3)
    mask = {"w": True, "b": False}
    reference = optax.chain(
        optax.clip_by_global_norm(0.5),
        optax.add_decayed_weights(0.01, mask),
        optax.sgd(schedule(0.1, 1, 3, 0.2), momentum=0.9),
    )
    ours_state, ref_state, p_ours, p_ref = ours.init(params), reference.init(params), params, params
    for step in range(3):
        grads = jax.tree.map(lambda p, k=step + 1: jnp.sin(p * k) * 3.0, p_ours)
        u_ours, ours_state = ours.update(grads, ours_state, p_ours)
        u_ref, ref_state = reference.update(grads, ref_state, p_ref)
        p_ours, p_ref = optax.apply_updates(p_ours, u_ours), optax.apply_updates(p_ref, u_ref)
        np.testing.assert_allclose(np.asarray(p_ours["w"]), np.asarray(p_ref["w"]), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(p_ours["b"]), np.asarray(p_ref["b"]), rtol=1e-6)
        assert float(current_lr(ours_state)) == pytest.approx(float(schedule(0.1, 1, 3, 0.2)(step)))


def test_sgd_refuses_a_momentum_of_one():
    with pytest.raises(ValueError, match=r"^optim.momentum=1.0 is invalid; allowed: a finite number >= 0.0 and < 1.0$"):
        SGD(lr=0.1, warmup_steps=0, clip_norm=1.0, momentum=1.0)


def test_values_that_change_no_shape_are_not_constants_of_the_compiled_update():
    """Two optimizers that differ in every numeric option lower to the same program (one compile for a sweep over
    them), and each applies its own values: the updates differ as optax's own chains at those values do."""
    params = nnx.state(_Toy(), nnx.Param)
    grads = jax.tree.map(lambda x: jnp.full_like(x, 0.7), params)
    a = dict(lr=1e-2, warmup_steps=1, weight_decay=0.1, clip_norm=0.5, b1=0.9, b2=0.99, final_fraction=0.2)
    b = dict(lr=3e-3, warmup_steps=2, weight_decay=0.01, clip_norm=0.3, b1=0.8, b2=0.95, final_fraction=0.1)
    programs, updates = [], []
    for opts, total in ((a, 3), (b, 7)):
        tx = AdamW(**opts)(params, total_steps=total)
        state = tx.init(params)
        programs.append(jax.jit(tx.update).lower(grads, state, params).as_text())
        theirs = optax.chain(
            optax.clip_by_global_norm(opts["clip_norm"]),
            optax.adamw(
                schedule(opts["lr"], opts["warmup_steps"], total, opts["final_fraction"]),
                b1=opts["b1"],
                b2=opts["b2"],
                weight_decay=opts["weight_decay"],
                mask=decay_mask(params),
            ),
        )
        s_theirs = theirs.init(params)
        for _ in range(3):  # past the warmup, where the rate is not 0
            u_ours, state = jax.jit(tx.update)(grads, state, params)
            u_theirs, s_theirs = theirs.update(grads, s_theirs, params)
        for x, y in zip(jax.tree.leaves(u_ours), jax.tree.leaves(u_theirs)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-9)
        updates.append(u_ours)
    assert programs[0] == programs[1]
    assert not np.allclose(updates[0]["w"][...], updates[1]["w"][...])
