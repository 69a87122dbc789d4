"""Blockwise attention beyond what the contract checker (test_normalizer_checker: blockwise = dense, outputs and
gradients, for every normalizer with a blockwise form) covers: eps = 0, bfloat16 against jax.nn.dot_product_attention,
the auto rule with sampled statistics, option refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.backends import sampled_rows
from attnlab.normalizers import base

pytestmark = pytest.mark.numerics  # `make test-numerics` runs these on whatever accelerator JAX sees

jax.config.update("jax_enable_x64", False)

N, H = 2, 8


def qkv(T, S, B=2, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(kq, (B, T, N, H)),
        jax.random.normal(kk, (B, S, N, H)),
        jax.random.normal(kv, (B, S, N, H)),
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


def test_rows_without_admissible_key_are_zero_at_eps0():
    q, k, v = qkv(10, 10)
    mask = nz.Mask(causal=True, key_valid_BS=padding(10, [5, 0], [10, 10]))
    norm = config.normalizer("squared", num_heads=N, head_dim=H, impl="blockwise", block_size=4, eps=0.0)
    out, grads = out_and_grads(norm, q, k, v, mask, jnp.ones(q.shape))
    np.testing.assert_array_equal(out[0, :5], 0.0)
    assert np.isfinite(np.asarray(out[:, 5:])).all()
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


def test_matches_dot_product_attention_with_bfloat16_and_T_not_multiple_of_block():
    q, k, v = (x.astype(jnp.bfloat16) for x in qkv(37, 37))
    attend = jax.jit(
        lambda q, k, v: config.attend(
            "softmax", q, k, v, causal=True, with_stats=False, impl="blockwise", block_size=16
        )[0]
    )
    out = attend(q, k, v)
    ref = jax.nn.dot_product_attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), is_causal=True
    )
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(out.astype(jnp.float32), ref, atol=3e-2)


def test_auto_rule_and_sampled_statistics(monkeypatch):
    monkeypatch.setattr(base, "memory_budget", lambda platform: 0)  # auto: every dense score over the budget
    monkeypatch.setattr(sampled_rows, "STATS_ROWS", 5)
    q, k, v = qkv(24, 24, B=1)
    out_b, stats_b = jax.jit(lambda q, k, v: config.attend("kl", q, k, v, causal=True, prior="recency"))(q, k, v)
    out_d, stats_d = jax.jit(lambda q, k, v: config.attend("kl", q, k, v, causal=True, prior="recency", impl="dense"))(
        q, k, v
    )
    np.testing.assert_allclose(out_b, out_d, rtol=2e-5, atol=2e-6)
    # The sampled statistics are the dense ones restricted to rows 0, 6, 12, 17, 23 (independent reference).
    rows = sampled_rows.stats_rows(24, 5)
    np.testing.assert_array_equal(rows, [0, 6, 12, 17, 23])
    att = config.attention_weights("kl", q, k, causal=True, prior="recency")[:, :, rows]
    p = np.asarray(att, np.float64)
    ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)[..., 1:] / np.log(rows[1:] + 1)
    np.testing.assert_allclose(stats_b["entropy"], ent.mean((0, 2)), rtol=1e-5)
    np.testing.assert_allclose(stats_b["max_weight"], p.max(-1).mean((0, 2)), rtol=1e-5)
    assert not np.allclose(stats_b["max_weight"], stats_d["max_weight"], rtol=1e-3)  # really a sample


@pytest.mark.parametrize("key,value", [("impl", "yes"), ("impl", True), ("block_size", 0), ("block_size", 64.0)])
def test_bad_options_are_refused_with_key_value_and_allowed(key, value):
    with pytest.raises(ValueError, match=rf"normalizer\.{key}={value!r} is invalid; allowed: "):
        config.normalizer("softmax", num_heads=2, head_dim=8, **{key: value})
