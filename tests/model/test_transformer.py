"""model.short_conv, model.window and model.layer_normalizers, each against an independent reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_helpers import compose_train, tiny_task
from flax import nnx

from attnlab.board.summaries import flatten_train_metrics
from attnlab.cli import ConfigError, hparams_of
from attnlab.config import normalizer as build_normalizer
from attnlab.config import registry
from attnlab.config.assembly import assemble
from attnlab.model import Transformer
from attnlab.model.attention import ShortConv
from attnlab.model.groups import leaf_groups
from attnlab.normalizers import Mask
from attnlab.statistics import CORE_STATS
from attnlab.steps import make_stats_step, make_train_step, probes_per_layer, sample_batch, step_key
from attnlab.train.state import fresh_state

NORMALIZERS = registry.choices("normalizer")


def conv_ref(x_BTC, valid_BT, w_KC, causal):
    """float64 numpy: zero the padding, y_t = Σ_j w_j x_{t−left+j} (0 outside), then SiLU."""
    x = np.where(valid_BT[..., None], x_BTC, 0.0).astype(np.float64)
    K, T = w_KC.shape[0], x.shape[1]
    left = K - 1 if causal else (K - 1) // 2
    y = np.zeros_like(x)
    for t in range(T):
        for j in range(K):
            s = t - left + j
            if 0 <= s < T:
                y[:, t] += w_KC[j] * x[:, s]
    return y / (1 + np.exp(-y))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("width", [1, 3, 4])
def test_short_conv_equals_numpy_and_padding_never_leaks(causal, width):
    rng = np.random.default_rng(width)
    B, T, C = 2, 7, 5
    x = rng.normal(size=(B, T, C)).astype(np.float32)
    valid = np.ones((B, T), bool)
    valid[1, 4:] = False
    conv = ShortConv(C, width, dtype=jnp.float32, rngs=nnx.Rngs(0))
    y = np.asarray(conv(jnp.asarray(x), jnp.asarray(valid), causal))
    np.testing.assert_allclose(y, conv_ref(x, valid, np.asarray(conv.kernel[...], np.float64), causal), atol=1e-5)
    x2 = np.where(valid[..., None], x, 100.0 * rng.normal(size=x.shape)).astype(np.float32)  # garbage padding
    y2 = np.asarray(conv(jnp.asarray(x2), jnp.asarray(valid), causal))
    np.testing.assert_array_equal(y2[valid], y[valid])


def test_padding_never_leaks_through_a_bidirectional_model_with_short_conv():
    make = lambda **kw: build_normalizer("softmax", **kw)  # noqa: E731
    body = Transformer(
        d_model=8,
        heads=2,
        layers=2,
        mlp_ratio=2,
        dropout=0.0,
        positional="learned",
        max_len=16,
        causal=False,
        qk_norm=False,
        pooled=True,
        make_normalizer=make,
        seq_len=9,
        vocab_size=13,
        window=3,
        short_conv=4,
        rngs=nnx.Rngs(0),
    )
    inputs = np.random.default_rng(0).integers(1, 13, size=(2, 9)).astype(np.int32)
    valid = np.ones((2, 9), bool)
    valid[:, 5:] = False
    other = np.where(valid, inputs, (inputs + 7) % 13)  # different tokens under the padding
    f1, _ = body(jnp.asarray(inputs), jnp.asarray(valid))
    f2, _ = body(jnp.asarray(other), jnp.asarray(valid))
    assert np.abs(np.asarray(f1)).min() > 0
    np.testing.assert_allclose(np.asarray(f1), np.asarray(f2), atol=1e-6)


def window_ref(T, window, causal, valid_S):
    """Query p sees key s iff s is valid, (causal) s ≤ p, and p − s < window (|p − s| when bidirectional)."""
    m = np.zeros((T, T), bool)
    for p in range(T):
        for s in range(T):
            d = p - s
            m[p, s] = valid_S[s] and (d >= 0 if causal else True) and (d < window if causal else abs(d) < window)
    return m


@pytest.mark.parametrize("causal", [True, False])
def test_window_mask_equals_reference_and_softmax_equals_jax_local_window(causal):
    B, T, N, H, w = 2, 11, 3, 5, 4
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.normal(size=(B, T, N, H)).astype(np.float32)) for _ in range(3))
    valid = np.ones((B, T), bool)
    valid[1, 8:] = False
    mask = Mask(key_valid_BS=jnp.asarray(valid), causal=causal, window=w)
    got = np.asarray(mask.matrix_B1TS(T, T))[:, 0]
    for b in range(B):
        np.testing.assert_array_equal(got[b], window_ref(T, w, causal, valid[b]))
    norm = build_normalizer("softmax", num_heads=N, head_dim=H, impl="dense")
    out = jnp.swapaxes(norm(*(jnp.swapaxes(x, 1, 2) for x in (q, k, v)), mask)[0], 1, 2)  # heads-major contract
    ref = jax.nn.dot_product_attention(
        q,
        k,
        v,
        mask=jnp.asarray(valid)[:, None, None, :],
        is_causal=causal,
        local_window_size=(w - 1, 0 if causal else w - 1),
    )
    rows = valid if not causal else np.ones_like(valid)  # rows of padded queries with no valid key differ by design
    np.testing.assert_allclose(np.asarray(out)[rows], np.asarray(ref)[rows], atol=1e-5)


def test_linear_attention_with_a_window_is_the_exact_windowed_form():
    B, T, N, H, w = 2, 9, 2, 3, 3
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(B, T, N, H)) for _ in range(3))
    mask = Mask(causal=True, window=w)
    norm = build_normalizer("linear", num_heads=N, head_dim=H)
    out_BNTH, _ = norm(*(jnp.swapaxes(jnp.asarray(a, jnp.float32), 1, 2) for a in (q, k, v)), mask)
    out = jnp.swapaxes(out_BNTH, 1, 2)
    phi = lambda x: np.where(x >= 0, x + 1, np.exp(np.minimum(x, 0)))  # noqa: E731  (elu + 1)
    a = np.einsum("btnh,bsnh->bnts", phi(q), phi(k)) * window_ref(T, w, True, np.ones(T, bool))
    ref = np.einsum("bnts,bsnh->btnh", a / (a.sum(-1, keepdims=True) + 1e-6), v)
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5)


def one_step(*overrides, task="mqar", with_stats=True):
    """Build in-process, take a train step (and a second); also the first step's batch loss by a plain forward."""
    cfg = compose_train("model=tiny", f"task={task}", *overrides, *tiny_task(task))
    task_obj, nets, tx, _ = assemble(cfg, "softmax_ce")
    net = nets[0]
    graphdef, params, _ = nnx.split(net, nnx.Param, ...)
    groups, layers = leaf_groups(params)
    state = fresh_state([net], tx, seed=0)
    data = jax.device_put(task_obj.batches(8))
    batch = sample_batch(data, step_key(jax.tree.map(lambda x: x[0], state)), 8)
    ref_loss = float(
        net.head.loss(net.head(net.body(batch["inputs"], batch["valid"])[0]), batch["targets"], batch["weights"])
    )
    before = jax.tree.map(lambda x: np.array(x, copy=True), state["params"])  # the step donates the state
    shape = dict(
        num_layers=len(net.body.blocks), num_heads=net.body.blocks[0].attn.num_heads, batch_size=8, batch_sharding=None
    )
    step = make_train_step(graphdef, tx, groups=groups, layers=layers, **shape)
    extra = make_stats_step(graphdef, probe_layers=probes_per_layer(net), **shape)(state, data) if with_stats else {}
    new_state, metrics = step(state, data)
    metrics = {**extra, **metrics}
    new_state, _ = step(new_state, data)  # the first step's learning rate is 0 (warmup from 0)
    return net, metrics, ref_loss, before, new_state


# Every normalizer with both options together (the full normalizer × short_conv × window grid, each
# option alone included, is the slow test below; each compile costs seconds on 2 cores): in the default suite
# the four whose window takes its own path (softmax's mask, linear's parallel form, stick-breaking's causal
# recursion, differential's split q and k), the others under `long`.
OWN_PATHS = ("softmax", "linear", "stickbreaking", "differential")
GRID = [pytest.param(n, 3, 3, marks=[] if n in OWN_PATHS else [pytest.mark.long]) for n in NORMALIZERS]


def check_step(name, conv, window):
    net, metrics, ref_loss, before, new_state = one_step(
        f"normalizer={name}",
        f"model.short_conv={conv}",
        f"model.window={'null' if window is None else window}",
        with_stats=False,
    )  # the plain step: the cheaper compile
    assert hasattr(net.body.blocks[0].attn, "conv") == (conv > 0) and net.body.window == window
    np.testing.assert_allclose(float(metrics["loss"][0]), ref_loss, rtol=1e-5)
    assert np.isfinite(float(metrics["grad_norm"][0, 0])) and int(metrics["nonfinite"][0]) == 0
    assert float(metrics["grad_norm"][0, 0]) > 0
    changed = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), before, new_state["params"])
    assert all(jax.tree.leaves(changed))  # every parameter moved, the short conv's kernel included


@pytest.mark.parametrize("name, conv, window", GRID)
def test_normalizer_short_conv_window_trains_a_step(name, conv, window):
    check_step(name, conv, window)


@pytest.mark.slow
@pytest.mark.parametrize("name", NORMALIZERS)
@pytest.mark.parametrize("conv, window", [(0, None), (3, None), (0, 3), (3, 3)])
def test_full_grid_trains_a_step(name, conv, window):
    check_step(name, conv, window)


def test_hybrid_statistics_are_the_union_of_its_layers():
    net, metrics, _, _, _ = one_step(
        "model.layers=3", "model.layer_normalizers=[softmax,linear]", "model.extreme_token_stats=true"
    )
    assert [type(b.attn.normalizer).__name__ for b in net.body.blocks] == ["Softmax", "Linear", "Softmax"]
    attn = jax.tree.map(lambda x: np.asarray(x[0]), metrics["attn"])  # (L, N) per statistic
    # softmax's extra, linear's, every layer's value drain, and the residual stream's after each block
    per_layer = {"value_drain", "massive_ratio", "kurtosis", "residual_peak"}
    assert set(attn) == {*CORE_STATS, "beta", "min_denominator", *per_layer}
    assert all(np.isfinite(attn[k]).all() for k in per_layer)
    assert np.isfinite(attn["beta"][[0, 2]]).all() and np.isnan(attn["beta"][1]).all()
    assert np.isnan(attn["min_denominator"][[0, 2]]).all() and np.isfinite(attn["min_denominator"][1]).all()
    np.testing.assert_allclose(attn["row_mass"], 1.0, atol=1e-4)  # both normalizers give rows of mass 1
    tags = flatten_train_metrics(jax.tree.map(lambda x: np.asarray(x[0]), metrics))
    assert "attn_beta/layer_0/head_0" in tags and "attn_beta/layer_1/head_0" not in tags
    assert "attn_min_denominator/layer_1/head_1" in tags and "attn_entropy/layer_1/head_0" in tags
    score_grad = np.asarray(metrics["score_grad"][0])  # (L, N): linear's kernel matrix is its scores too
    assert score_grad.shape == (3, 2) and np.isfinite(score_grad).all() and (score_grad > 0).all()


def test_score_grad_for_every_layer_with_a_score_matrix_whatever_the_others():
    """Differential attention has two score maps (no one dL/dz): its layer's row is NaN and untagged; the softmax
    layers' gradients at the scores are there (nonzero), one layer without no longer turning off the others'."""
    net, metrics, _, _, _ = one_step("model.layers=3", "model.layer_normalizers=[softmax,differential,softmax]")
    score_grad = np.asarray(metrics["score_grad"][0])
    assert np.isfinite(score_grad[[0, 2]]).all() and (score_grad[[0, 2]] > 0).all() and np.isnan(score_grad[1]).all()
    tags = flatten_train_metrics(jax.tree.map(lambda x: np.asarray(x[0]), metrics))
    assert {"score_grad/layer_0", "score_grad/layer_2"} <= set(tags) and "score_grad/layer_1" not in tags
    # the residual stream's statistics only where asked for (model.extreme_token_stats): the attention's are all here
    assert set(metrics["attn"]) == {*CORE_STATS, "beta", "diff_lambda"}


def test_hybrid_layers_use_their_own_yaml_and_the_selected_normalizers_overrides():
    cfg = compose_train(
        "model=tiny",
        "model.layers=2",
        "normalizer=kl",
        "normalizer.prior=recency",
        "model.layer_normalizers=[kl,softmax1]",
        *tiny_task("mqar"),
    )
    _, nets, _, _ = assemble(cfg, "softmax_ce")
    kl, s1 = (b.attn.normalizer for b in nets[0].body.blocks)
    assert type(kl).__name__ == "KL" and kl.prior == "recency" and type(s1).__name__ == "Softmax1"


@pytest.mark.parametrize(
    "override, needle",
    [
        (
            "model.layer_normalizers=[softmax,nope]",
            "model.layer_normalizers=['softmax', 'nope'] names unknown normalizer(s) nope; "
            "allowed: differential, entmax",
        ),
        (
            "model.layer_normalizers=[sofmax,linear,lineer]",
            "names unknown normalizer(s) sofmax (did you mean softmax?), lineer (did you mean linear?); allowed: ",
        ),
        ("model.layer_normalizers=softmax", "model.layer_normalizers='softmax' is invalid"),
        ("model.layer_normalizers=[]", "is invalid; allowed: null or a non-empty list"),
        ("model.window=0", "model.window=0 is invalid; allowed: an integer >= 1"),
        ("model.short_conv=-1", "model.short_conv=-1 is invalid; allowed: an integer >= 0 and <= 64"),
        ("model.short_conv=100000", "model.short_conv=100000 is invalid; allowed: an integer >= 0 and <= 64"),
        ("model.short_conv=true", "model.short_conv=True is invalid"),
    ],
)
def test_bad_model_options_fail_in_one_line(override, needle):
    cfg = compose_train("model=tiny", override, *tiny_task("mqar"))
    with pytest.raises((ConfigError, ValueError)) as e:
        assemble(cfg, "softmax_ce")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_hparams_record_the_layer_layout_as_one_string():
    cfg = compose_train("model=tiny", "model.layer_normalizers=[softmax,linear]", *tiny_task("mqar"))
    flat = hparams_of(cfg, {"normalizer": "softmax"})
    assert flat["model.layer_normalizers"] == "softmax,linear" and flat["model.short_conv"] == 0


def test_bfloat16_compute_keeps_float32_master_params_and_optimizer_state():
    """Mixed precision: bfloat16 activations, float32 parameters, Adam moments and loss."""
    net, metrics, ref_loss, before, new_state = one_step("accelerator.dtype=bfloat16", with_stats=False)
    assert net.body.dtype == jnp.bfloat16
    floats = [
        x
        for x in jax.tree.leaves((new_state["params"], new_state["opt_state"]))
        if jnp.issubdtype(x.dtype, jnp.floating)
    ]
    assert len(floats) > 3 * len(jax.tree.leaves(new_state["params"])) - 1  # params, mu and nu
    assert {x.dtype for x in floats} == {jnp.dtype(jnp.float32)}
    assert metrics["loss"].dtype == jnp.float32
    inputs, valid = jnp.zeros((2, 16), jnp.int32), jnp.ones((2, 16), bool)
    assert net.body(inputs, valid)[0].dtype == jnp.bfloat16  # the compute really is bfloat16
    np.testing.assert_allclose(float(metrics["loss"][0]), ref_loss, rtol=2e-2)


def test_pooled_features_are_a_float32_mean_under_bfloat16():
    from attnlab.config import normalizer as build_norm
    from attnlab.model import Transformer

    net = Transformer(
        d_model=16,
        heads=2,
        layers=1,
        mlp_ratio=2,
        dropout=0.0,
        positional="learned",
        max_len=64,
        causal=False,
        qk_norm=False,
        pooled=True,
        seq_len=64,
        vocab_size=5,
        make_normalizer=lambda **kw: build_norm("softmax", **kw),
        dtype=jnp.bfloat16,
        rngs=nnx.Rngs(0),
    )
    inputs = jnp.asarray(np.random.default_rng(0).integers(0, 5, (2, 64)))
    valid = jnp.arange(64)[None] < jnp.array([[64], [37]])
    pooled = net(inputs, valid)[0]
    net.pooled = False
    tokens = np.asarray(net(inputs, valid)[0], np.float64)  # the bfloat16 per-token features, exactly
    want = np.stack([tokens[0].mean(0), tokens[1, :37].mean(0)])
    assert pooled.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(pooled), want, rtol=1e-6, atol=1e-6)


def test_an_attention_only_block_is_the_residual_plus_attention():
    """model.mlp_ratio=0: no MLP parameters, and each block's output is x + attn(LN(x)) (Elhage et al. 2021)."""
    make = lambda **kw: build_normalizer("softmax", **kw)  # noqa: E731
    body = Transformer(
        d_model=8,
        heads=2,
        layers=2,
        mlp_ratio=0,
        dropout=0.0,
        positional="rope",
        max_len=16,
        causal=True,
        qk_norm=False,
        pooled=False,
        make_normalizer=make,
        seq_len=6,
        vocab_size=11,
        rngs=nnx.Rngs(0),
    )
    names = {".".join(map(str, path)) for path, _ in nnx.iter_graph(body) if path}
    assert not any("fc1" in n or "fc2" in n or "ln2" in n for n in names)
    x_BTD = jnp.asarray(np.random.default_rng(3).normal(size=(2, 6, 8)), jnp.float32)
    mask = body.mask(jnp.ones((2, 6), bool))
    block = body.blocks[0]
    got, _, _ = block(x_BTD, mask, with_stats=False, score_probe_BNTS=None, deterministic=True, rngs=None)
    attended, _ = block.attn(block.ln1(x_BTD), mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(x_BTD + attended), rtol=1e-6, atol=1e-6)
