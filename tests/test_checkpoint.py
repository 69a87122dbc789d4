"""attnlab.checkpoint: the last `keep` saves kept, the newest readable one restored bit for bit, a corrupt newest one
passed over with a warning, and none usable a CheckpointError (the CLI's resume over it: train/test_reliability.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnlab.checkpoint import CheckpointError, Checkpoints


def state(step):
    rng = np.random.default_rng(step)
    return {
        "params": {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), "b": jnp.zeros(4, jnp.bfloat16) + step},
        "step": jnp.asarray(step, jnp.int32),
    }


def same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def corrupt(directory):
    for path in directory.rglob("*"):
        if path.is_file():
            path.write_bytes(b"\0garbage")


def saved(tmp_path, steps, keep=2):
    ckpts = Checkpoints(tmp_path, keep=keep)
    for step in steps:
        ckpts.save(step, state(step), {"best": {"val/loss": float(step)}})
    return ckpts


def test_the_last_keep_saves_are_kept_and_the_newest_restored_bit_for_bit(tmp_path):
    ckpts = saved(tmp_path, [1, 2, 3])
    assert ckpts.steps() == [2, 3]
    step, restored, meta = ckpts.restore_latest(state(0))
    assert step == 3 and meta == {"best": {"val/loss": 3.0}}
    same(restored, state(3))


def test_saving_a_step_already_saved_keeps_the_first(tmp_path):
    ckpts = saved(tmp_path, [5])
    ckpts.save(5, state(6), {"best": {}})
    step, restored, meta = ckpts.restore_latest(state(0))
    assert step == 5 and meta == {"best": {"val/loss": 5.0}}
    same(restored, state(5))


def test_a_corrupt_newest_checkpoint_falls_back_to_the_one_before_with_a_warning(tmp_path):
    ckpts = saved(tmp_path, [1, 2])
    corrupt(ckpts.directory / "2")
    with pytest.warns(UserWarning, match=r"checkpoints/2 is unreadable .*falling back"):
        step, restored, _ = ckpts.restore_latest(state(0))
    assert step == 1
    same(restored, state(1))


def test_no_usable_checkpoint_is_an_error_naming_the_directory_and_the_steps_tried(tmp_path):
    ckpts = saved(tmp_path, [1, 2])
    corrupt(ckpts.directory)
    with (
        pytest.warns(UserWarning),
        pytest.raises(CheckpointError, match=r"no usable checkpoint in .*checkpoints \(tried steps \[1, 2\]\)"),
    ):
        ckpts.restore_latest(state(0))


def test_no_checkpoint_at_all_is_none(tmp_path):
    assert Checkpoints(tmp_path).restore_latest(state(0)) is None
