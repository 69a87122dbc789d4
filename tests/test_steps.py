"""The train step's bookkeeping without a kernel per leaf: gradient norms from one reduction over every
leaf and the finiteness of the updated parameters (the clip that reuses the step's norm: test_optim.py)."""

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.model.groups import named_grad_norms
from attnlab.steps import FINITE_GROUP, SUM_ROW, all_finite, grad_norms, leaf_sums

SHAPES = [(3,), (SUM_ROW,), (SUM_ROW + 1,), (37, 61), (2, 3, SUM_ROW - 5), (8,)]


def leaves(seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=s) * 10.0 ** rng.integers(-3, 3), jnp.float32) for s in SHAPES]


def test_leaf_sums_are_each_leafs_sum_in_float64():
    xs = leaves()
    got = leaf_sums(xs, jnp.square)
    want = [np.sum(np.square(np.asarray(x, np.float64))) for x in xs]
    np.testing.assert_allclose(got, want, rtol=2e-6)


def test_grad_norms_group_the_leaf_sums_as_declared():
    xs = leaves(1)
    groups = ["embedding", "attention", "beta:normalizer", "mlp", "attention", "beta:normalizer"]
    layers = [-1, 0, 0, 1, 1, 1]
    out = named_grad_norms(jax.jit(lambda g: grad_norms(g, groups, layers, num_layers=2))(xs))
    sq = np.array([np.sum(np.square(np.asarray(x, np.float64))) for x in xs])

    def norm(pick):
        return np.sqrt(sq[[i for i in range(len(xs)) if pick(i)]].sum())

    np.testing.assert_allclose(out["global"], np.sqrt(sq.sum()), rtol=2e-6)
    np.testing.assert_allclose(out["group/attention"], norm(lambda i: groups[i] == "attention"), rtol=2e-6)
    np.testing.assert_allclose(out["group/normalizer"], norm(lambda i: groups[i].endswith("normalizer")), rtol=2e-6)
    np.testing.assert_allclose(out["beta"], norm(lambda i: groups[i].startswith("beta:")), rtol=2e-6)
    np.testing.assert_allclose(out["group/head"], 0.0)
    np.testing.assert_allclose(
        out["layer"], [norm(lambda i: layers[i] == 0), norm(lambda i: layers[i] == 1)], rtol=2e-6
    )


def test_all_finite_sees_one_bad_element_in_any_leaf():
    """In any leaf of any group: more leaves than two groups hold, so the last group is a partial one."""
    xs = (leaves(2) * (2 * FINITE_GROUP // len(SHAPES) + 2))[: 2 * FINITE_GROUP + 3]
    assert bool(all_finite(xs))
    for leaf in range(len(xs)):
        for bad in (np.inf, -np.inf, np.nan):
            ys = list(xs)
            ys[leaf] = ys[leaf].ravel().at[-1].set(bad).reshape(ys[leaf].shape)
            assert not bool(all_finite(ys)), (leaf, bad)
