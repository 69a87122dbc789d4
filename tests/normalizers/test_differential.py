"""Differential attention (normalizers/differential.py) beyond the shared contract checks: the checker catches a wrong
λ and a missing per-head normalisation against the float64 reference, λ fixed at 0 is softmax on the first halves
with the RMS norm, the model tells each layer its depth (λ_init's schedule), and RoPE rotates each half alone."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.backends.impl import DENSE_BYTES_PER_SCORE, memory_budget
from attnlab.model import Transformer
from attnlab.model.attention import rope, rope_parts
from attnlab.testing import ContractViolation, check_normalizer, mask_setting
from attnlab.testing.normalizer import LAYER_INDEX

pytestmark = pytest.mark.numerics


def _differential(**options):
    return functools.partial(config.normalizer, "differential", **options)


class _LambdaWithoutInit(nz.Differential):
    """λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2): λ_init left out of λ (the output's 1 − λ_init kept)."""

    def lam(self):
        return super().lam() - self.lambda_init()


class _LambdaOneLayerOff(nz.Differential):
    """λ_init of the next layer: the schedule read with a 1-based index."""

    def lambda_init(self):
        return nz.differential.lambda_init_at(self.layer_index[...] + 1.0)


class _NoHeadNorm(nz.Differential):
    """Weights right, the per-head RMS norm and the 1 − λ_init factor left out."""

    def head_norm(self, o_BNTH):
        return o_BNTH


class _NoInitFactor(nz.Differential):
    """The RMS norm without the 1 − λ_init factor."""

    def head_norm(self, o_BNTH):
        return (super().head_norm(o_BNTH).astype(jnp.float32) / (1.0 - self.lambda_init())).astype(o_BNTH.dtype)


@pytest.mark.parametrize(
    "cls,prop",
    [
        (_LambdaWithoutInit, "reference: weights:"),
        (_LambdaOneLayerOff, "reference: weights:"),
        (_NoHeadNorm, "reference: output (plain step):"),
        (_NoInitFactor, "reference: output (plain step):"),
    ],
    ids=lambda x: x.__name__ if isinstance(x, type) else None,
)
def test_the_checker_catches_a_wrong_lambda_or_a_missing_head_norm(cls, prop):
    """The float64 reference computes λ, λ_init (from the layer index the checker sets, LAYER_INDEX) and the RMS norm
    from their formulas, so an implementation that gets one wrong fails at the first mask setting."""
    with pytest.raises(ContractViolation) as info:
        check_normalizer(cls, name="broken")
    msg = str(info.value)
    assert msg.startswith(f"normalizer=broken: {prop}") and "mask=none" in msg, msg


def test_the_reference_itself_is_at_the_layer_the_checker_sets():
    norm = config.normalizer("differential", num_heads=2, head_dim=4)
    norm.set_layer_index(LAYER_INDEX)
    assert norm._reference_lambda_init() == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * LAYER_INDEX))
    assert float(norm.lambda_init()) == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * LAYER_INDEX), rel=1e-6)


def _rms_np(o, eps=1e-5):
    return o / np.sqrt(np.mean(o**2, -1, keepdims=True) + eps)


@pytest.mark.parametrize("impl", ["dense", "blockwise"])
@pytest.mark.parametrize("setting", ["causal_pad", "dense", "pad"])
def test_lambda_fixed_at_zero_is_softmax_on_the_first_halves_with_the_rms_norm(impl, setting):
    """λ_init = 0 fixed, λ not learned: λ = 0 and 1 − λ_init = 1, so the output is RMSNorm(softmax(β q₁k₁ᵀ)·v) and
    the weights softmax's on the first halves (attnlab's softmax normalizer at β = 1/√(H/2) on q₁, k₁)."""
    B, N, H = 2, 3, 6
    T, S, mask, _ = mask_setting(setting)
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(B, N, n, H)).astype(np.float32) for n in (T, S, S))
    diff = config.normalizer(
        "differential", num_heads=N, head_dim=H, lambda_init=0.0, learnable_lambda=False, impl=impl, block_size=4
    )
    soft = config.normalizer("softmax", num_heads=N, head_dim=H, beta=1 / math.sqrt(H // 2), impl="dense")
    w_soft = np.asarray(soft.weights(q[..., :3], k[..., :3], mask))
    o_soft = np.asarray(soft(q[..., :3], k[..., :3], v, mask)[0], np.float64)
    np.testing.assert_allclose(np.asarray(diff.weights(q, k, mask)), w_soft, atol=1e-6)
    out, stats = diff(q, k, v, mask, with_stats=True)
    np.testing.assert_allclose(np.asarray(diff(q, k, v, mask)[0]), _rms_np(o_soft), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(out), _rms_np(o_soft), atol=2e-5, rtol=1e-4)
    assert np.all(np.asarray(stats["diff_lambda"]) == 0.0)
    soft_stats = soft(q[..., :3], k[..., :3], v, mask, with_stats=True)[1]
    for key in ("entropy", "first_weight", "self_weight", "max_weight", "row_mass"):
        np.testing.assert_allclose(np.asarray(stats[key]), np.asarray(soft_stats[key]), atol=1e-6, err_msg=key)


def _model(normalizers, **overrides):
    """A 3-layer causal model over 7 tokens whose layers cycle through `normalizers` (YAML names or factories)."""
    makers = [functools.partial(config.normalizer, n) if isinstance(n, str) else n for n in normalizers]
    kwargs = dict(d_model=16, heads=2, layers=3, mlp_ratio=2, dropout=0.0, positional="learned", max_len=8)
    kwargs.update(causal=True, qk_norm=False, pooled=False, seq_len=8, vocab_size=7, rngs=nnx.Rngs(0))
    return Transformer(**{**kwargs, "make_normalizer": makers, **overrides})


def test_the_model_tells_each_layer_its_depth():
    """λ_init = 0.8 − 0.6·exp(−0.3·i) at layer i (the paper's l = i + 1), in a hybrid too; the layers stay one
    graph (their index is state), so model.remat scans them."""
    model = _model(["differential"], layers=3)
    got = [float(b.attn.normalizer.lambda_init()) for b in model.blocks]
    np.testing.assert_allclose(got, [0.8 - 0.6 * math.exp(-0.3 * i) for i in range(3)], rtol=1e-6)
    assert len({nnx.graphdef(b) for b in model.blocks}) == 1
    hybrid = _model(["softmax", "differential"], layers=4)
    got = [float(b.attn.normalizer.lambda_init()) for b in hybrid.blocks[1::2]]
    np.testing.assert_allclose(got, [0.8 - 0.6 * math.exp(-0.3 * i) for i in (1, 3)], rtol=1e-6)
    fixed = _model([_differential(lambda_init=0.5)])
    assert {float(b.attn.normalizer.lambda_init()) for b in fixed.blocks} == {0.5}
    tokens, valid = jnp.zeros((2, 8), jnp.int32), jnp.ones((2, 8), bool)
    scanned = _model(["differential"], layers=3, remat=True)(tokens, valid, with_stats=True)
    plain = model(tokens, valid, with_stats=True)
    np.testing.assert_allclose(np.asarray(scanned[0]), np.asarray(plain[0]), atol=1e-5)
    lam = [float(b.attn.normalizer.lam()) for b in model.blocks]
    np.testing.assert_allclose(np.asarray(plain[1]["diff_lambda"][:, 0]), lam, rtol=1e-6)


def test_rope_rotates_each_half_alone_so_each_map_sees_relative_positions():
    """The same q and k at every position: under RoPE a score map depends on t − s only (a Toeplitz matrix). Rotated
    by halves (qk_split = 2) each half's map is; rotated as one head (pairs i, i + H/2 across the halves) it is not.
    An odd head dim keeps its last channel as it is."""
    T, H = 6, 8
    rng = np.random.default_rng(0)
    q = jnp.broadcast_to(jnp.asarray(rng.normal(size=H), jnp.float32), (1, 1, T, H))
    k = jnp.broadcast_to(jnp.asarray(rng.normal(size=H), jnp.float32), (1, 1, T, H))
    pos = jnp.arange(T)

    def toeplitz(a):
        return all(np.allclose(np.diagonal(a, d)[0], np.diagonal(a, d), atol=1e-5) for d in range(-T + 1, T))

    for parts, expected in ((2, True), (1, False)):
        qr, kr = rope_parts(q, pos, parts), rope_parts(k, pos, parts)
        z1 = np.asarray(qr[0, 0, :, :4] @ kr[0, 0, :, :4].T)
        assert toeplitz(z1) == expected, parts
    x = jnp.asarray(rng.normal(size=(1, 1, T, 5)), jnp.float32)
    y = rope_parts(x, pos, 2)
    np.testing.assert_array_equal(np.asarray(y[..., 4]), np.asarray(x[..., 4]))
    np.testing.assert_allclose(np.asarray(y[..., :2]), np.asarray(rope(x[..., :2], pos)))
    np.testing.assert_array_equal(np.asarray(rope_parts(x, pos, 1)), np.asarray(rope(x, pos)))
    # in the model: attention rotates a differential head's q and k by halves
    model = _model(["differential"], layers=1, positional="rope")
    attn, x = model.blocks[0].attn, model.embed_inputs(jnp.asarray(rng.integers(0, 7, (1, 8))))
    q0, k0, _ = attn.qkv(x).reshape(1, 8, 3, 2, 8).transpose(2, 0, 3, 1, 4)
    q_m, k_m, _ = attn.heads(x, model.mask_at(8))
    np.testing.assert_allclose(np.asarray(q_m), np.asarray(rope_parts(q0, jnp.arange(8), 2)), atol=1e-6)
    np.testing.assert_allclose(np.asarray(k_m), np.asarray(rope_parts(k0, jnp.arange(8), 2)), atol=1e-6)


def test_a_head_dim_below_two_is_refused():
    with pytest.raises(nz.base.checks.ConfigError, match="head dim .*at least 2"):
        config.normalizer("differential", num_heads=2, head_dim=1)


def test_the_backend_choice_counts_two_score_maps_per_head():
    """The dense form keeps two T×S maps per head: at a T where one map of softmax's scores (one sequence, one head)
    fits the platform's budget and two do not, here 1.5 maps' worth, auto keeps softmax dense and takes differential
    blockwise (T = 9,459 on a CPU's 1 GiB)."""
    mask = nz.Mask(causal=True)
    T = math.isqrt(memory_budget(jax.default_backend()) * 2 // (3 * DENSE_BYTES_PER_SCORE))
    for name, expected in (("softmax", "dense"), ("differential", "blockwise")):
        norm = config.normalizer(name, num_heads=1, head_dim=8)
        assert norm.backend(T, T, mask, jnp.float32).name == expected, name


class _SignedWithoutEntropy(nz.Differential):
    """Signed weights whose reference leaves the entropy to the definition for non-negative weights."""

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        w, logits, extras = super().reference(q_BNTH, k_BNSH, admissible_BTS)
        return w, logits, {key: value for key, value in extras.items() if key != "entropy"}


def test_signed_weights_must_define_their_entropy():
    with pytest.raises(ContractViolation, match="statistics keys: a normalizer with signed weights defines its own"):
        check_normalizer(_SignedWithoutEntropy, name="broken")
