"""model.output_gate (Qiu et al. 2025, gated attention at G1): one attention layer against a float64 numpy
reference, its statistic, padding, parameter groups and refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab.checks import ConfigError
from attnlab.model import Transformer
from attnlab.model.attention import MultiHeadAttention
from attnlab.model.groups import leaf_groups
from attnlab.normalizers import Mask

B, T, D, N = 2, 6, 8, 2
H = D // N


def layer(gate: str) -> MultiHeadAttention:
    return MultiHeadAttention(
        D,
        N,
        lambda **kw: config.normalizer("softmax", **kw),
        use_rope=False,
        qk_norm=False,
        seq_len=T,
        dtype=jnp.float32,
        rngs=nnx.Rngs(0),
        output_gate=gate,
    )


def inputs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(B, T, D)).astype(np.float32)
    valid = np.ones((B, T), bool)
    valid[1, 4:] = False
    return x, valid


def reference(mha: MultiHeadAttention, x_BTD, valid_BT, gate: str):
    """float64: causal softmax attention per head, each head's output times σ(x·W_θ) (Qiu et al. 2025, Eq. 5),
    concatenated, then the output projection; and the gate's mean per head over valid tokens."""
    x = np.asarray(x_BTD, np.float64)
    qkv = x @ np.asarray(mha.qkv.kernel[...], np.float64)
    q, k, v = (qkv[..., i * D : (i + 1) * D].reshape(B, T, N, H) for i in range(3))
    beta = np.asarray(mha.normalizer.beta(), np.float64)
    o = np.zeros((B, T, N, H))
    for b in range(B):
        for n in range(N):
            for t in range(T):
                keys = [s for s in range(t + 1) if valid_BT[b, s]]
                z = beta[n] * np.array([q[b, t, n] @ k[b, s, n] for s in keys])
                p = np.exp(z - z.max())
                o[b, t, n] = (p / p.sum()) @ v[b, keys, n]
    means = np.zeros(N)
    if gate != "none":
        g = 1 / (1 + np.exp(-(x @ np.asarray(mha.gate.kernel[...], np.float64))))
        g_BTNH = g[..., :, None] * np.ones(H) if gate == "headwise" else g.reshape(B, T, N, H)
        o = o * g_BTNH
        means = np.array([g_BTNH[..., n, :].mean(-1)[valid_BT].mean() for n in range(N)])
    return o.reshape(B, T, D) @ np.asarray(mha.out.kernel[...], np.float64), means


@pytest.mark.parametrize("gate", ["none", "headwise", "elementwise"])
def test_gated_layer_matches_the_float64_reference(gate):
    mha = layer(gate)
    if gate != "none":  # a gate off its initial values, so σ(x·W) is far from ½ and differs across heads
        mha.gate.kernel[...] = 3.0 * mha.gate.kernel[...]
    x, valid = inputs()
    mask = Mask(key_valid_BS=jnp.asarray(valid), causal=True, right_padded=True)
    y, stats = mha(jnp.asarray(x), mask, with_stats=True)
    y_ref, means = reference(mha, x, valid, gate)
    np.testing.assert_allclose(np.asarray(y)[valid], y_ref[valid], atol=2e-5, rtol=1e-4)
    if gate == "none":
        assert not hasattr(mha, "gate") and "gate_mean" not in stats
    else:
        assert mha.gate.kernel[...].shape == (D, N if gate == "headwise" else D)
        np.testing.assert_allclose(np.asarray(stats["gate_mean"]), means, atol=1e-6)
        y_plain, _ = layer("none")(jnp.asarray(x), mask)  # same q, k, v, out weights (same seed, same order)
        assert np.abs(np.asarray(y_plain) - np.asarray(y))[valid].max() > 1e-2


def _body(gate: str):
    return Transformer(
        d_model=D,
        heads=N,
        layers=2,
        mlp_ratio=2,
        dropout=0.0,
        positional="learned",
        max_len=16,
        causal=True,
        qk_norm=False,
        pooled=False,
        make_normalizer=lambda **kw: config.normalizer("softpick", **kw),
        seq_len=T,
        vocab_size=11,
        output_gate=gate,
        rngs=nnx.Rngs(0),
    )


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_gate_is_tagged_attention_and_padding_never_leaks(gate):
    body = _body(gate)
    _, params, _ = nnx.split(body, nnx.Param, ...)
    groups, _ = leaf_groups(params)  # raises on an untagged parameter
    flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
    gate_groups = [g for (path, _), g in zip(flat, groups) if "gate" in [str(getattr(k, "key", "")) for k in path]]
    assert gate_groups == ["attention", "attention"]
    tokens = np.random.default_rng(1).integers(1, 11, size=(B, T)).astype(np.int32)
    valid = np.ones((B, T), bool)
    valid[:, 4:] = False
    other = np.where(valid, tokens, (tokens + 5) % 11)
    y1, stats = body(jnp.asarray(tokens), jnp.asarray(valid), with_stats=True)
    y2, _ = body(jnp.asarray(other), jnp.asarray(valid))
    np.testing.assert_array_equal(np.asarray(y1)[valid], np.asarray(y2)[valid])
    assert stats["gate_mean"].shape == (2, N) and stats["zero_share"].shape == (2, N)


@pytest.mark.parametrize("value", ["sometimes", True, None])
def test_bad_output_gate_is_refused_in_one_line(value):
    with pytest.raises(ConfigError, match=r"^model.output_gate=.* is invalid; allowed: none, headwise, elementwise$"):
        _body(value)
