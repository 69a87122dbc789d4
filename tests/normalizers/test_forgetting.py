"""normalizer=forgetting (FoX, Lin et al. 2025) with its gates projected from a layer input: fla's naive forgetting
attention ported, gradients (q, k, the layer input, w_f, b_f) against finite differences of the float64 reference,
padding as fla's unpadding, the constant gate as KL's recency prior, and attention passing the layer input.

The shared suites draw forgetting at its check_variants without a layer input (the gate σ(b_f) everywhere)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.config import assembly
from attnlab.model.attention import MultiHeadAttention

pytestmark = pytest.mark.numerics

B, N, H = 2, 3, 4
D = N * H


def build(impl="dense", **opts):
    return config.normalizer("forgetting", num_heads=N, head_dim=H, impl=impl, block_size=4, rngs=nnx.Rngs(1), **opts)


def fla_naive_forgetting_attn(q_BTHD, k_BTHD, v_BTHD, g_BTH, scale):
    """fla-org/flash-linear-attention, fla/ops/forgetting_attn/naive.py `naive_forgetting_attn` (no window, no GQA),
    ported line for line to numpy: softmax(q·k·scale + gc_i − gc_j) under a causal mask, gc = cumsum(g)."""
    T = q_BTHD.shape[1]
    gc = np.cumsum(g_BTH, 1)
    mask = np.tril(np.ones((T, T), bool))
    ref = np.einsum("bqhd,bkhd->bhqk", q_BTHD * scale, k_BTHD)
    ref = ref + np.transpose(gc, (0, 2, 1))[..., None] - np.transpose(gc, (0, 2, 1))[:, :, None, :]
    ref = np.where(mask[None, None], ref, -np.inf)
    p = np.exp(ref - ref.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v_BTHD)


@pytest.mark.parametrize("impl", ["dense", "blockwise"])
def test_agrees_with_fla_naive_forgetting_attention(impl):
    T = 10
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(B, T, N, H)).astype(np.float32) for _ in range(3))
    x = rng.normal(size=(B, T, D)).astype(np.float32)
    norm = build(impl, gate_bias=1.0)
    g = np.asarray(jax.nn.log_sigmoid(x @ np.asarray(norm.gate_w[...]) + np.asarray(norm.gate_b[...])))
    assert g.min() < -1.0  # the gates forget visibly at this input
    ref = fla_naive_forgetting_attn(q, k, v, g, 1 / math.sqrt(H))
    sw = lambda a: jnp.swapaxes(jnp.asarray(a), 1, 2)  # noqa: E731
    out, _ = norm(sw(q), sw(k), sw(v), nz.Mask(causal=True), layer_input_BTD=jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(sw(out)), ref, atol=2e-6, rtol=1e-5)


def _central(f, x, h=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        g[i] = (f(xp) - f(xm)) / (2 * h)
    return g


@pytest.mark.parametrize("impl", ["dense", "blockwise"])
def test_gradients_match_finite_differences_of_the_float64_reference(impl):
    """dL/dq, dL/dk, dL/dx (the layer input), dL/dw_f and dL/db_f of L = Σ out·ct, with a padded key in the middle
    of batch 1 and the last key of batch 0 padded."""
    T = 6
    rng = np.random.default_rng(2)
    q, k, v, ct = (rng.normal(size=(B, N, T, H)) for _ in range(4))
    x = rng.normal(size=(B, T, D))
    valid = np.ones((B, T), bool)
    valid[1, 2], valid[0, 5] = False, False
    adm = np.tril(np.ones((T, T), bool))[None] & valid[:, None, :]
    mask = nz.Mask(causal=True, key_valid_BS=jnp.asarray(valid))
    norm = build(impl, gate_bias=0.5)
    w_f, b_f = np.asarray(norm.gate_w[...], np.float64), np.asarray(norm.gate_b[...], np.float64)

    def loss_ref(q=q, k=k, x=x, w=w_f, b=b_f):
        norm.gate_w[...], norm.gate_b[...] = jnp.asarray(w, jnp.float32), jnp.asarray(b, jnp.float32)
        out = np.einsum("bnts,bnsh->bnth", norm.reference(q, k, adm, x, valid)[0], v)
        return float(np.sum(out * ct))

    refs = [
        _central(lambda a: loss_ref(q=a), q),
        _central(lambda a: loss_ref(k=a), k),
        _central(lambda a: loss_ref(x=a), x),
    ]
    # w_f and b_f are float32 in the module: steps of 1e-3 over the values it holds
    for name, p0 in (("w", w_f), ("b", b_f)):
        g = np.zeros_like(p0)
        for i in np.ndindex(p0.shape):
            hi, lo = p0.copy(), p0.copy()
            hi[i] += 1e-3
            lo[i] -= 1e-3
            held = float(np.float32(hi[i])) - float(np.float32(lo[i]))
            g[i] = (loss_ref(**{name: hi}) - loss_ref(**{name: lo})) / held
        refs.append(g)
    norm.gate_w[...], norm.gate_b[...] = jnp.asarray(w_f, jnp.float32), jnp.asarray(b_f, jnp.float32)

    graphdef, state = nnx.split(norm)

    def loss(state, q, k, x):
        out, _ = nnx.merge(graphdef, state)(q, k, jnp.asarray(v, jnp.float32), mask, layer_input_BTD=x)
        return jnp.sum(out * ct)

    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    g_s, g_q, g_k, g_x = jax.grad(loss, (0, 1, 2, 3))(state, f32(q), f32(k), f32(x))
    for got, ref in zip((g_q, g_k, g_x, g_s["gate_w"][...], g_s["gate_b"][...]), refs):
        np.testing.assert_allclose(np.asarray(got), ref, atol=2e-4, rtol=2e-3)


def test_a_padded_position_forgets_nothing_as_if_removed():
    """fla unpads before the kernel: a sequence with a padded key in the middle attends as the sequence without it."""
    T, drop = 7, 3
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(1, N, T, H)).astype(np.float32) for _ in range(3))
    x = rng.normal(size=(1, T, D)).astype(np.float32)
    valid = np.ones((1, T), bool)
    valid[0, drop] = False
    norm = build(gate_bias=-0.5)
    out, _ = norm(q, k, v, nz.Mask(causal=True, key_valid_BS=jnp.asarray(valid)), layer_input_BTD=jnp.asarray(x))
    keep = np.flatnonzero(valid[0])
    out_kept, _ = norm(q[:, :, keep], k[:, :, keep], v[:, :, keep], nz.Mask(causal=True), layer_input_BTD=x[:, keep])
    np.testing.assert_allclose(np.asarray(out)[:, :, keep], np.asarray(out_kept), atol=1e-6)


def test_a_constant_gate_is_kls_recency_prior():
    """w_f = 0: f = σ(b) at every position, so F_ij = σ(b)^{i−j} and the weights are KL's softmax(βz − λ|i − j|)
    with λ = −log σ(b) (the paper's data-independent ablation)."""
    T, b = 9, 0.3
    rng = np.random.default_rng(4)
    q, k = (jnp.asarray(rng.normal(size=(B, N, T, H)), jnp.float32) for _ in range(2))
    norm = build(gate_bias=b)
    norm.gate_w[...] = jnp.zeros_like(norm.gate_w[...])
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    kl = config.normalizer("kl", num_heads=N, head_dim=H, prior="recency", slope=-math.log(1 / (1 + math.exp(-b))))
    mask = nz.Mask(causal=True)
    np.testing.assert_allclose(
        np.asarray(norm.weights(q, k, mask, layer_input_BTD=x)), np.asarray(kl.weights(q, k, mask)), atol=1e-6
    )


def test_attention_passes_its_normalised_input_to_the_gate():
    """In a layer the gates come from the attention's input: changing w_f changes the output and the maps."""
    mha = MultiHeadAttention(
        D,
        N,
        lambda **kw: config.normalizer("forgetting", **kw),
        use_rope=False,
        qk_norm=False,
        seq_len=8,
        dtype=jnp.float32,
        rngs=nnx.Rngs(0),
    )
    x = jnp.asarray(np.random.default_rng(5).normal(size=(B, 8, D)), jnp.float32)
    mask = nz.Mask(causal=True)
    y1, stats = mha(x, mask, with_stats=True)
    maps1 = mha.weights(x, mask)
    q, k, _ = mha.heads(x, mask)
    np.testing.assert_allclose(
        np.asarray(maps1), np.asarray(mha.normalizer.weights(q, k, mask, layer_input_BTD=x)), atol=0
    )
    mha.normalizer.gate_w[...] = 2.0 * mha.normalizer.gate_w[...]
    y2, _ = mha(x, mask)
    assert np.abs(np.asarray(y1) - np.asarray(y2)).max() > 1e-3
    assert np.abs(np.asarray(mha.weights(x, mask)) - np.asarray(maps1)).max() > 1e-3
    assert stats["forget_gate"].shape == (N,) and (0 < np.asarray(stats["forget_gate"])).all()


def test_a_bidirectional_model_is_refused_naming_the_task():
    from cli_helpers import compose_train, tiny_task

    from attnlab.checks import ConfigError

    cfg = compose_train("model=tiny", "task=listops", "normalizer=forgetting", *tiny_task("listops"))
    with pytest.raises(ConfigError) as err:
        assembly.assemble(cfg, "softmax_ce")
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        "normalizer=forgetting needs causal attention, but task=listops is a per-sequence task"
    ), message
    with pytest.raises(ValueError, match="^normalizer=forgetting needs causal attention"):
        config.attend("forgetting", *np.zeros((3, 1, 4, N, H), np.float32))  # the public helper, no causal mask
