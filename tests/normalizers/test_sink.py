"""Softpick, the learnable sink and the soft cap against their formulas: hand-computed rows, float64 references and
finite differences, fla's naive attention with sinks, softmax₁ as the sink's b = 0 case, blockwise = dense.

The shared suites (test_normalizers_formulas, _grad, test_blockwise) draw softpick and sink at their classes'
check_variants too (masks, padding, empty rows, jit, blockwise); this file holds what is particular to them."""

import math

import jax
import jax.numpy as jnp
import normalizer_refs as R
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.checks import ConfigError
from attnlab.config import registry

pytestmark = pytest.mark.numerics


def heads_major(x):
    return jnp.swapaxes(jnp.asarray(x), 1, 2)


def build(name, impl="dense", block_size=4, **opts):
    return config.normalizer(name, num_heads=R.N, head_dim=R.H, impl=impl, block_size=block_size, **opts)


# ---------------------------------------------------------------------------------------------
# softpick


def test_softpick_rows_by_hand():
    """x = [log 2, 0, −log 2, log 3]: e^x − 1 = [1, 0, −½, 2], so w = [1, 0, 0, 2]/3.5; a row of x ≤ 0 weighs 0."""
    x_1114 = jnp.log(jnp.array([2.0, 1.0, 0.5, 3.0]))[None, None, None]
    norm = config.normalizer("softpick", num_heads=1, head_dim=4, beta=1.0, eps=0.0)
    m = jnp.ones((1, 1, 1, 4), bool)
    w = np.asarray(norm.normalize(x_1114, m)[0])[0, 0, 0]
    np.testing.assert_allclose(w, np.array([1, 0, 0, 2]) / 3.5, rtol=1e-6)
    # a masked key (the 2, here) leaves numerator and denominator: [1, 0, −½]/1.5
    w = np.asarray(norm.normalize(x_1114, m.at[..., 3].set(False))[0])[0, 0, 0]
    np.testing.assert_allclose(w, [1 / 1.5, 0, 0, 0], rtol=1e-6)
    w = np.asarray(norm.normalize(-jnp.abs(x_1114), m)[0])
    assert (w == 0).all()


def test_softpick_extreme_rows_are_finite_and_exact():
    """Scores ±1e4·|z|: all-negative rows weigh exactly 0 (Eq. 2's numerator), a positive row sums to 1 on its
    largest keys (exp(x − m) underflows for the rest); the floor m ≥ 0 keeps e^{−m} from overflowing, and
    gradients stay finite."""
    T, S, mask, m = R.make_mask("causal_pad")
    q, k, v = R.qkv(5, T, S)
    k[1], q[1] = np.abs(k[1]), -np.abs(q[1])  # batch 1: every score < 0
    k[0], q[0] = np.abs(k[0]), np.abs(q[0])  # batch 0: every score > 0
    norm = build("softpick", beta=1e4)
    w = np.asarray(norm.weights(heads_major(q), heads_major(k), mask))
    assert np.isfinite(w).all()
    assert (w[1] == 0).all()
    rows = m[0].any(-1)
    np.testing.assert_allclose(w[0].sum(-1)[:, rows], 1.0, atol=1e-6)

    def loss(q, k, v):
        return jnp.sum(norm(heads_major(q), heads_major(k), heads_major(v), mask)[0] ** 2)

    grads = jax.grad(loss, (0, 1, 2))(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_softpick_is_not_softmax_and_reports_its_zeros():
    """Rows sum below 1 where some scores are negative (softmax's sum to 1); zero_share counts keys with x ≤ 0."""
    T, S, mask, m = R.make_mask("causal_pad")
    q, k, v = R.qkv(6, T, S, scale=3.0)
    norm = build("softpick")
    qh, kh = heads_major(q), heads_major(k)
    w = np.asarray(norm.weights(qh, kh, mask))
    x = np.asarray(norm.beta())[None, :, None, None] * np.einsum("bnth,bnsh->bnts", np.asarray(qh), np.asarray(kh))
    has = np.broadcast_to(m[:, None].any(-1), w.shape[:3])
    assert (w.sum(-1)[has] < 1 - 1e-3).mean() > 0.5
    zeros = (np.broadcast_to(m[:, None], x.shape) & (x <= 0)).sum(-1) / np.maximum(m.sum(-1), 1)[:, None]
    expected = np.where(has, zeros, 0).sum((0, 2)) / has.sum((0, 2))
    _, stats = norm(qh, kh, heads_major(v), mask, with_stats=True)
    np.testing.assert_allclose(np.asarray(stats["zero_share"]), expected, atol=1e-6)
    assert (np.asarray(stats["row_mass"]) < 1).all()


def _loss_ref(norm, q_BNTH, k_BNSH, v_BNSH, m, ct_BNTH):
    w, _, _ = norm.reference(q_BNTH, k_BNSH, m)
    return float(np.sum(np.einsum("bnts,bnsh->bnth", w, v_BNSH) * ct_BNTH))


def _central(f, x, h=1e-6):
    """Central differences of scalar f at every entry of float64 array x."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        g[i] = (f(xp) - f(xm)) / (2 * h)
    return g


def _small_case(seed=3):
    """B=2, N=3, T=S=6, H=5, causal with padding (batch 1's first key, so its first row is empty)."""
    rng = np.random.default_rng(seed)
    T = S = 6
    q, k, v, ct = (rng.normal(size=(R.B, R.N, T, R.H)) for _ in range(4))
    valid = np.ones((R.B, S), bool)
    valid[1, 0] = False
    valid[0, 5] = False
    mask = nz.Mask(causal=True, key_valid_BS=jnp.asarray(valid))
    return q, k, v, ct, mask, R.admissible(R.B, T, S, valid, None, True)


@pytest.mark.parametrize(
    "name,opts",
    [("softpick", {"beta": 1.3}), ("softpick", {"beta": 0.8, "softcap": 1.0}), ("sink", {"sink": 0.4})],
    ids=["softpick", "softpick-softcap", "sink"],
)
@pytest.mark.parametrize("impl", ["dense", "blockwise"])
def test_gradients_match_finite_differences_of_the_float64_reference(name, opts, impl):
    """dL/dq, dL/dk (and dL/dβ, dL/db for the sink) of L = Σ out·ct, out = w·v, against central differences of
    the float64 reference: a backward with a wrong denominator term (softpick's sign(u)·δ, the sink's e^{b−r})
    fails here."""
    q, k, v, ct, mask, m = _small_case()
    norm = build(name, impl=impl, **opts)
    g_ref = [
        _central(lambda x: _loss_ref(norm, x, k, v, m, ct), q),
        _central(lambda x: _loss_ref(norm, q, x, v, m, ct), k),
    ]
    graphdef, params, rest = nnx.split(norm, nz.NormalizerParam, ...)

    def loss(params, q, k):
        out, _ = nnx.merge(graphdef, params, rest)(q, k, jnp.asarray(v, jnp.float32), mask)
        return jnp.sum(out * ct)

    g_p, g_q, g_k = jax.grad(loss, (0, 1, 2))(params, jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32))
    for g, ref in zip((g_q, g_k), g_ref):
        np.testing.assert_allclose(np.asarray(g), ref, atol=2e-4, rtol=2e-3)
    # β = e^θ: dL/dθ = β·dL/dβ, dL/dβ by rebuilding at β ± h (one β per head: every head moves); the modules
    # keep β and b in float32, so the step is over the values they hold
    beta = opts["beta"] if "beta" in opts else 1 / math.sqrt(R.H)

    def slope(key, value, read, h=1e-3):
        lo, hi = build(name, **{**opts, key: value - h}), build(name, **{**opts, key: value + h})
        rise = _loss_ref(hi, q, k, v, m, ct) - _loss_ref(lo, q, k, v, m, ct)
        return rise / float(read(hi) - read(lo))

    dbeta = slope("beta", beta, lambda n: n.beta()[0])
    np.testing.assert_allclose(float(g_p["beta"]["theta"][...].sum()), beta * dbeta, rtol=2e-3, atol=2e-4)
    if name == "sink":
        dsink = slope("sink", opts["sink"], lambda n: n.sink[...][0])
        np.testing.assert_allclose(float(g_p["sink"][...].sum()), dsink, rtol=2e-3, atol=2e-4)


# ---------------------------------------------------------------------------------------------
# the learnable sink


@pytest.mark.parametrize("kind", ["causal_pad", "dense"])
def test_sink_at_fixed_zero_is_softmax1_exactly(kind):
    """b_h = 0, not learned: the same weights, outputs and gradients as softmax₁, bit for bit, dense and blockwise."""
    T, S, mask, _ = R.make_mask(kind)
    q, k, v = (heads_major(x) for x in R.qkv(9, T, S, scale=2.0))
    for impl in ("dense", "blockwise"):
        sink = build("sink", impl=impl, sink=0.0, learnable_sink=False)
        one = build("softmax1", impl=impl)
        np.testing.assert_array_equal(np.asarray(sink.weights(q, k, mask)), np.asarray(one.weights(q, k, mask)))

        def grads(norm):
            return jax.grad(lambda q, k, v: jnp.sum(jnp.sin(norm(q, k, v, mask)[0])), (0, 1, 2))(q, k, v)

        np.testing.assert_array_equal(np.asarray(sink(q, k, v, mask)[0]), np.asarray(one(q, k, v, mask)[0]))
        for a, b in zip(grads(sink), grads(one)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sink_weight_is_the_missing_mass_and_a_very_negative_sink_is_softmax():
    """1 − Σw = e^b/(e^b + Σe^x) per row; b = −1e4 gives masked softmax."""
    T, S, mask, m = R.make_mask("pad")
    q, k, _ = (heads_major(x) for x in R.qkv(10, T, S))
    b = 1.2
    norm = build("sink", sink=b)
    x = np.asarray(norm.beta())[None, :, None, None] * np.einsum("bnth,bnsh->bnts", np.asarray(q), np.asarray(k))
    lse = np.log(np.where(m[:, None], np.exp(x), 0).sum(-1))
    w = np.asarray(norm.weights(q, k, mask))
    np.testing.assert_allclose(1 - w.sum(-1), 1 / (1 + np.exp(lse - b)), atol=2e-6)
    gone = build("sink", sink=-1e4)
    soft = build("softmax")
    np.testing.assert_allclose(np.asarray(gone.weights(q, k, mask)), np.asarray(soft.weights(q, k, mask)), atol=1e-7)


def fla_naive_parallel_attn_with_sinks(q_BTHD, k_BTHD, v_BTHD, sinks_H, scale):
    """fla-org/flash-linear-attention, fla/ops/attn/naive.py `naive_parallel_attn` (causal, no window, no gate,
    no GQA: G = 1), its `sinks` branch ported line for line to numpy."""
    B, TQ, H, D = q_BTHD.shape
    TK = k_BTHD.shape[1]
    scores = np.einsum("bqhd,bkhd->bhqk", q_BTHD, k_BTHD) * scale
    row_idx, col_idx = np.arange(TQ)[:, None], np.arange(TK)[None, :]
    scores = np.where((col_idx > row_idx)[None, None], -np.inf, scores)
    max_logits = scores.max(-1)
    sink_logits = sinks_H[None, :, None]
    max_logits = np.maximum(max_logits, sink_logits)
    probs_unnorm = np.exp(scores - max_logits[..., None])
    sink_unnorm = np.exp(sink_logits - max_logits)
    denom = probs_unnorm.sum(-1) + sink_unnorm
    output = np.einsum("bhqk,bkhd->bqhd", probs_unnorm, v_BTHD)
    return output / np.transpose(denom, (0, 2, 1))[..., None]


@pytest.mark.parametrize("impl", ["dense", "blockwise"])
def test_sink_agrees_with_fla_naive_attention_with_sinks(impl):
    T, D = 11, R.H
    rng = np.random.default_rng(12)
    q, k, v = (rng.normal(size=(R.B, T, R.N, D)).astype(np.float32) for _ in range(3))
    sinks = np.array([-1.0, 0.5, 2.0], np.float32)
    norm = build("sink", impl=impl)
    norm.sink[...] = jnp.asarray(sinks)
    out = norm(heads_major(q), heads_major(k), heads_major(v), nz.Mask(causal=True))[0]
    ref = fla_naive_parallel_attn_with_sinks(q, k, v, sinks, 1 / math.sqrt(D))
    np.testing.assert_allclose(np.asarray(jnp.swapaxes(out, 1, 2)), ref, atol=2e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# the soft cap on every scored normalizer


def _options(name):
    return {k: v for k, v in registry.load("normalizer", name).items() if not k.startswith("_")}


# softpick, sink, forgetting and differential apply the cap in their own references (their check_variants have one;
# differential's two maps read halves of q and k, which identity keys of head dim S cannot stand for)
SCORED = [
    n
    for n in registry.choices("normalizer")
    if "softcap" in _options(n) and n not in ("softpick", "sink", "forgetting", "differential")
]


@pytest.mark.parametrize("name", SCORED)
def test_softcap_matches_each_reference_on_capped_scores(name):
    """Weights, plain-step and statistics-step output of every scored normalizer with softcap=c against its class's
    float64 reference fed the capped scores: queries (c/β)·tanh(βz/c) and identity keys (head dim S), so that the
    reference's own βq·k is c·tanh(βz/c) and its bias, prior or gate comes after; max |logit| is the capped one."""
    c, beta = 1.5, 2.0
    T, S, mask, m = R.make_mask("causal_pad")
    q, k, v = R.qkv(13, T, S)
    opts = {**next(iter(R.variants(name).values())), "beta": beta}
    norm = R.build(name, {**opts, "softcap": c})
    z_BNTS = R.scores(q, k)
    capped_BNTS = (c / beta) * np.tanh(beta * z_BNTS / c)
    plain = config.normalizer(name, num_heads=R.N, head_dim=S, rngs=nnx.Rngs(0), **opts)
    eye_BNSS = np.broadcast_to(np.eye(S), (R.B, R.N, S, S))
    w_ref, logits_ref, _ = plain.reference(capped_BNTS, eye_BNSS, m)
    np.testing.assert_allclose(np.asarray(norm.weights(q, k, mask)), w_ref, atol=2e-5, rtol=1e-4)
    out_ref = np.einsum("bnts,bsnh->btnh", w_ref, v.astype(np.float64))
    np.testing.assert_allclose(np.asarray(norm(q, k, v, mask)[0]), out_ref, atol=2e-5, rtol=1e-4)  # the plain step
    out, stats = norm(q, k, v, mask, with_stats=True)
    np.testing.assert_allclose(np.asarray(out), out_ref, atol=2e-5, rtol=1e-4)
    max_logit_N = np.where(np.broadcast_to(m[:, None], logits_ref.shape), np.abs(logits_ref), 0).max((0, 2, 3))
    np.testing.assert_allclose(np.asarray(stats["max_logit"]), max_logit_N, rtol=2e-5, atol=1e-6)
    if name in ("softmax", "softmax1", "relu", "squared", "entmax", "stickbreaking"):
        assert (np.asarray(stats["max_logit"]) <= c + 1e-6).all()


def test_softcap_is_gemma2s_cap_on_the_scaled_scores():
    """softmax with softcap = softmax(c·tanh(βz/c)) written out, with its gradients (q, k, v and θ), plain step
    (dense, blockwise) and logging step; capping z instead of βz, or leaving the cap out, fails."""
    c, beta = 0.8, 1.7
    T, S, mask, m = R.make_mask("grad")
    q, k, v = (heads_major(x) for x in R.qkv(14, T, S, scale=2.0))
    m_B1TS = jnp.asarray(m[:, None])

    def direct(theta_N, q, k, v):
        x = jnp.exp(theta_N)[None, :, None, None] * jnp.einsum("bnth,bnsh->bnts", q, k)
        w = nz.masked_softmax(c * jnp.tanh(x / c), m_B1TS)
        return jnp.einsum("bnts,bnsh->bnth", w, v)

    ct = jax.random.normal(jax.random.key(0), q.shape)
    theta = jnp.full((R.N,), math.log(beta))
    ref_out = direct(theta, q, k, v)
    ref_g = jax.grad(lambda *a: jnp.sum(direct(*a) * ct), (0, 1, 2, 3))(theta, q, k, v)
    for impl, with_stats in (("dense", False), ("dense", True), ("blockwise", False)):
        norm = build("softmax", impl=impl, beta=beta, softcap=c)
        graphdef, params, rest = nnx.split(norm, nz.NormalizerParam, ...)

        def loss(params, q, k, v):
            out = nnx.merge(graphdef, params, rest)(q, k, v, mask, with_stats=with_stats)[0]  # noqa: B023
            return jnp.sum(out * ct), out

        (_, out), g = jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True)(params, q, k, v)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out), atol=2e-6, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(g[0]["beta"]["theta"][...]), np.asarray(ref_g[0]), rtol=1e-4, atol=1e-5)
        for a, b in zip(g[1:], ref_g[1:]):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    plain = build("softmax", beta=beta)
    assert np.abs(np.asarray(plain(q, k, v, mask)[0]) - np.asarray(ref_out)).max() > 1e-2


@pytest.mark.parametrize("name", ["kl", "sigmoid", "ssmax", "squared"])
def test_softcap_blockwise_equals_dense(name):
    """Outputs and gradients (q, k, v and the normalizer's parameters) of the capped blockwise form."""
    opts = {**list(R.variants(name).values())[-1], "softcap": 1.2}
    opts.pop("adaptive_temperature", None)
    T, S, mask, _ = R.make_mask("grad")
    q, k, v = (heads_major(x) for x in R.qkv(15, T, S, scale=2.0))
    ct = jax.random.normal(jax.random.key(1), q.shape)
    res = []
    for impl in ("dense", "blockwise"):
        norm = build(name, impl=impl, **opts)
        graphdef, params, rest = nnx.split(norm, nz.NormalizerParam, ...)

        def loss(params, q, k, v):
            out = nnx.merge(graphdef, params, rest)(q, k, v, mask)[0]  # noqa: B023
            return jnp.sum(out * ct), out

        res.append(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True)(params, q, k, v))
    (_, out_d), g_d = res[0]
    (_, out_b), g_b = res[1]
    np.testing.assert_allclose(np.asarray(out_b), np.asarray(out_d), atol=2e-6, rtol=2e-5)
    for a, b in zip(jax.tree.leaves(g_b), jax.tree.leaves(g_d), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# refusals


@pytest.mark.parametrize(
    "name,opts,message",
    [
        ("softmax", {"softcap": 0.0}, "normalizer.softcap=0.0 is invalid"),
        ("kl", {"softcap": -1.0}, "normalizer.softcap=-1.0 is invalid"),
        ("entmax", {"softcap": "big"}, "normalizer.softcap='big' is invalid"),
        ("softpick", {"eps": -1e-9}, "normalizer.eps=-1e-09 is invalid"),
        ("sink", {"sink": float("nan")}, "normalizer.sink=nan is invalid"),
        ("sink", {"learnable_sink": "yes"}, "normalizer.learnable_sink='yes' is invalid"),
        ("softmax", {"softcap": 2.0, "impl": "cudnn"}, "normalizer.impl='cudnn' is invalid"),
        ("sigmoid", {"softcap": 2.0, "impl": "pallas"}, "normalizer.impl='pallas' is invalid"),
        ("stickbreaking", {"softcap": 2.0, "impl": "blockwise"}, "normalizer.impl='blockwise' is invalid"),
    ],
)
def test_bad_values_are_refused_in_one_line(name, opts, message):
    with pytest.raises(ConfigError) as err:
        config.normalizer(name, num_heads=2, head_dim=4, **opts)
    assert message in str(err.value) and "\n" not in str(err.value)
