"""model.norm and model.mlp: the LLaMA block (RMSNorm, SwiGLU) against float64 numpy, its shapes, and a train step."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from test_transformer import one_step

from attnlab.cli import ConfigError
from attnlab.config import normalizer as build_normalizer
from attnlab.model.block import Block, swiglu_width
from attnlab.normalizers import Mask


def block(norm, mlp, d_model=64, mlp_ratio=4):
    make = lambda **kw: build_normalizer("softmax", **kw)  # noqa: E731
    return Block(d_model, 4, mlp_ratio, 0.0, make, use_rope=True, qk_norm=False, seq_len=8, dtype=np.float32,
                 rngs=nnx.Rngs(0), norm=norm, mlp=mlp)  # fmt: skip


def layernorm64(x, scale, bias, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * scale + bias


def rmsnorm64(x, scale, eps=1e-6):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * scale


def gelu64(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def relu64(x):
    return np.maximum(x, 0.0)


def silu64(x):
    return x / (1 + np.exp(-x))


@pytest.mark.parametrize(
    "norm, mlp", [("rmsnorm", "swiglu"), ("layernorm", "gelu"), ("rmsnorm", "gelu"), ("layernorm", "relu")]
)
def test_the_mlp_half_of_a_block_against_float64(norm, mlp):
    """block(x) − (x + attention) is the MLP of the normalised stream, computed here in float64 from the weights."""
    b = block(norm, mlp)
    x_BTD = np.random.default_rng(0).normal(size=(2, 8, 64)).astype(np.float32)
    mask = Mask(causal=True)
    out, _, _ = b(x_BTD, mask, with_stats=False, score_probe_BNTS=None, deterministic=True, rngs=None)
    a_BTD, _ = b.attn(b.ln1(x_BTD), mask)
    h = np.float64(x_BTD) + np.float64(a_BTD)
    p = jax.tree.map(lambda v: np.float64(v), nnx.to_pure_dict(nnx.state(b, nnx.Param)))
    n = rmsnorm64(h, p["ln2"]["scale"]) if norm == "rmsnorm" else layernorm64(h, p["ln2"]["scale"], p["ln2"]["bias"])
    u = n @ p["fc1"]["kernel"] + p["fc1"].get("bias", 0.0)
    if mlp == "swiglu":
        F = swiglu_width(4, 64)
        act = silu64(u[..., :F]) * u[..., F:]
    else:
        act = relu64(u) if mlp == "relu" else gelu64(u)
    want = h + act @ p["fc2"]["kernel"] + p["fc2"].get("bias", 0.0)
    np.testing.assert_allclose(np.asarray(out), want, rtol=2e-4, atol=2e-5)


def test_the_llama_block_has_no_biases_and_swiglus_width():
    p = nnx.to_pure_dict(nnx.state(block("rmsnorm", "swiglu"), nnx.Param))
    assert swiglu_width(4, 64) == 192 and swiglu_width(4, 768) == 2048  # ⌈(2/3)·4·d / 64⌉·64
    assert p["fc1"].keys() == {"kernel"} and p["fc1"]["kernel"].shape == (64, 2 * 192)
    assert p["fc2"].keys() == {"kernel"} and p["fc2"]["kernel"].shape == (192, 64)
    assert p["ln1"].keys() == p["ln2"].keys() == {"scale"}  # RMSNorm: no bias, no mean


def test_a_llama_model_trains_a_step_and_matches_its_plain_forward():
    net, metrics, ref_loss, before, after = one_step("model.norm=rmsnorm", "model.mlp=swiglu")
    assert type(net.body.ln_f).__name__ == "RMSNorm"
    np.testing.assert_allclose(float(metrics["loss"][0]), ref_loss, rtol=1e-5)
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), before, after["params"])
    assert all(v > 0 for v in jax.tree.leaves(moved))  # every parameter, SwiGLU's and RMSNorm's included, trains


@pytest.mark.parametrize("key, value", [("norm", "batchnorm"), ("mlp", "tanh")])
def test_an_unknown_norm_or_mlp_is_refused_naming_the_choices(key, value):
    with pytest.raises(ConfigError, match=f"model.{key}='{value}' is invalid; allowed: "):
        one_step(f"model.{key}={value}")
