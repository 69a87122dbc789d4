"""Blockwise attention equals the dense form: outputs and gradients (q, k, v, β and prior parameters)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import normalizers as nz
from attnlab.normalizers import impl, sampled_rows

pytestmark = pytest.mark.numerics  # `make test-numerics` runs these on whatever accelerator JAX sees

jax.config.update("jax_enable_x64", False)

CASES = {
    "softmax": ("softmax", {}),
    "kl_uniform": ("kl", {"prior": "uniform"}),
    "kl_recency": ("kl", {"prior": "recency", "slope": 0.3}),
    "kl_learned": ("kl", {"prior": "learned", "max_distance": 4}),
    "softmax1": ("softmax1", {}),
    "sigmoid": ("sigmoid", {}),
    "relu": ("relu", {}),
    "squared": ("squared", {}),
    "squared_eps0": ("squared", {"eps": 0.0}),
    "squared_offset": ("squared", {"offset": True, "learnable": True}),
    "ssmax": ("ssmax", {}),
    "ssmax_bias": ("ssmax", {"bias": True, "s": 0.8}),
    "stickbreaking": ("stickbreaking", {}),
    "stickbreaking_current": ("stickbreaking", {"attend_current": True, "beta": 0.9}),
}


def build(case, blockwise, block_size=4):
    name, opts = CASES[case]
    impl = "blockwise" if blockwise else "dense"
    norm = nz.build(name, num_heads=2, head_dim=8, impl=impl, block_size=block_size, **opts)
    if name == "kl" and opts["prior"] == "learned":  # a non-uniform table, so its gradient is not trivial
        norm.table[...] = jax.random.normal(jax.random.key(3), norm.table[...].shape)
    return norm


def qkv(T, S, B=2, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(kq, (B, T, 2, 8)),
        jax.random.normal(kk, (B, S, 2, 8)),
        jax.random.normal(kv, (B, S, 2, 8)),
    )


def out_and_grads(norm, q, k, v, mask, ct):
    graphdef, params, rest = nnx.split(norm, nz.NormalizerParam, ...)

    def loss(params, q, k, v):
        heads_major = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  the normalizer contract is (B,N,T,H)
        out, _ = nnx.merge(graphdef, params, rest)(heads_major(q), heads_major(k), heads_major(v), mask)
        return jnp.sum(heads_major(out) * ct), heads_major(out)

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True))(params, q, k, v)
    return out, grads


def padding(S, first_valid, last_valid):
    """key_valid (2, S): batch row b keeps keys first_valid[b] <= s < last_valid[b]."""
    s = jnp.arange(S)[None, :]
    return (s >= jnp.array(first_valid)[:, None]) & (s < jnp.array(last_valid)[:, None])


# Each scenario mixes several features (T ≠ S, T not a multiple of the block size 4, padding,
# rows with no admissible key, windows, dense masks) to keep the compile count, and the file, small.
SCENARIOS = {
    # T < S: query t sees keys s <= t + 3; batch 0's first 5 keys are padding, so its rows 0 and 1 have no key.
    "causal_padded_T_ne_S": (10, 13, lambda: nz.Mask(causal=True, key_valid_BS=padding(13, [5, 0], [13, 10]))),
    "causal_window": (11, 11, lambda: nz.Mask(causal=True, window=3, key_valid_BS=padding(11, [0, 0], [11, 9]))),
    "bidirectional_window_dense": (
        9,
        7,
        lambda: nz.Mask(window=4, dense_BTS=jax.random.bernoulli(jax.random.key(7), 0.7, (2, 9, 7))),
    ),
    "bidirectional": (6, 9, lambda: nz.Mask()),
}


# The default suite runs every normalizer on the first scenario and each other scenario on the
# normalizers whose code it exercises (the admissible count n of sigmoid/relu under windows, the
# sum form of squared...); the full matrix is marked slow.
FAST = {
    "causal_padded_T_ne_S": [c for c in CASES if c != "kl_uniform"],
    "causal_window": ["softmax1", "sigmoid", "relu", "kl_recency", "ssmax_bias", "stickbreaking_current"],
    "bidirectional_window_dense": ["softmax", "sigmoid", "squared", "ssmax"],
    "bidirectional": ["kl_learned", "relu", "squared_eps0"],
}
CAUSAL_ONLY = ("stickbreaking", "stickbreaking_current")  # refused under the bidirectional scenarios
PAIRS = [
    pytest.param(c, sc, marks=() if c in FAST[sc] else pytest.mark.slow, id=f"{c}-{sc}")
    for sc in SCENARIOS
    for c in CASES
    if c not in CAUSAL_ONLY or sc.startswith("causal")
]


@pytest.mark.parametrize("case,scenario", PAIRS)
def test_blockwise_equals_dense_outputs_and_gradients(case, scenario):
    T, S, make_mask = SCENARIOS[scenario]
    q, k, v = qkv(T, S)
    mask = make_mask()
    ct = jax.random.normal(jax.random.key(1), q.shape)
    out_d, g_d = out_and_grads(build(case, False), q, k, v, mask, ct)
    out_b, g_b = out_and_grads(build(case, True), q, k, v, mask, ct)
    np.testing.assert_allclose(out_b, out_d, rtol=2e-5, atol=2e-6)
    for gb, gd in zip(jax.tree.leaves(g_b), jax.tree.leaves(g_d), strict=True):
        np.testing.assert_allclose(gb, gd, rtol=1e-4, atol=1e-5)
    if CASES[case][1].get("learnable", CASES[case][0] != "squared"):
        assert len(jax.tree.leaves(g_b[0])) >= 1  # β (and the prior) received a gradient


def test_rows_without_admissible_key_are_zero_at_eps0():
    q, k, v = qkv(10, 10)
    mask = nz.Mask(causal=True, key_valid_BS=padding(10, [5, 0], [10, 10]))
    out, grads = out_and_grads(build("squared_eps0", True), q, k, v, mask, jnp.ones(q.shape))
    np.testing.assert_array_equal(out[0, :5], 0.0)
    assert np.isfinite(np.asarray(out[:, 5:])).all()
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


def test_matches_dot_product_attention_with_bfloat16_and_T_not_multiple_of_block():
    q, k, v = (x.astype(jnp.bfloat16) for x in qkv(37, 37))
    attend = jax.jit(
        lambda q, k, v: nz.attend("softmax", q, k, v, causal=True, with_stats=False, impl="blockwise", block_size=16)[0]
    )
    out = attend(q, k, v)
    ref = jax.nn.dot_product_attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), is_causal=True
    )
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(out.astype(jnp.float32), ref, atol=3e-2)


def test_auto_rule_and_sampled_statistics(monkeypatch):
    monkeypatch.setitem(impl.DEFAULT_BUDGET_BYTES, "cpu", 0)  # auto: every dense score tensor over the budget
    monkeypatch.setattr(sampled_rows, "STATS_ROWS", 5)
    q, k, v = qkv(24, 24, B=1)
    out_b, stats_b = jax.jit(lambda q, k, v: nz.attend("kl", q, k, v, causal=True, prior="recency"))(q, k, v)
    out_d, stats_d = jax.jit(lambda q, k, v: nz.attend("kl", q, k, v, causal=True, prior="recency", impl="dense"))(
        q, k, v
    )
    np.testing.assert_allclose(out_b, out_d, rtol=2e-5, atol=2e-6)
    # The sampled statistics are the dense ones restricted to rows 0, 6, 12, 17, 23 (independent reference).
    rows = sampled_rows.stats_rows(24, 5)
    np.testing.assert_array_equal(rows, [0, 6, 12, 17, 23])
    att = nz.attention_weights("kl", q, k, causal=True, prior="recency")[:, :, rows]
    p = np.asarray(att, np.float64)
    ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)[..., 1:] / np.log(rows[1:] + 1)
    np.testing.assert_allclose(stats_b["entropy"], ent.mean((0, 2)), rtol=1e-5)
    np.testing.assert_allclose(stats_b["max_weight"], p.max(-1).mean((0, 2)), rtol=1e-5)
    assert not np.allclose(stats_b["max_weight"], stats_d["max_weight"], rtol=1e-3)  # really a sample


@pytest.mark.parametrize("key,value", [("impl", "yes"), ("impl", True), ("block_size", 0), ("block_size", 64.0)])
def test_bad_options_are_refused_with_key_value_and_allowed(key, value):
    with pytest.raises(ValueError, match=rf"normalizer\.{key}={value!r} is invalid; allowed: "):
        nz.build("softmax", num_heads=2, head_dim=8, **{key: value})
