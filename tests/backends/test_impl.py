"""normalizer.impl: the backend choice as a pure function (a table, refusals included), its memory budget, the
choice recorded at build and read by the plain step, the logging step and run.json, and the XLA path of
jax.nn.dot_product_attention (is_causal, key lengths, local_window_size) against the dense form."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.backends import impl
from attnlab.backends.blockwise import BlockForm
from attnlab.config import registry
from attnlab.normalizers import Mask

FORM = BlockForm("exp", {}, logits=None)  # a blockwise form; which one matters to no backend these lines ask
SOFTMAX, KL_RECENCY, ENTMAX = impl.Capability(True, FORM), impl.Capability(False, FORM), impl.Capability(False)
BF16, F32 = jnp.bfloat16, jnp.float32
PAD = jnp.ones((2, 8), bool)
RIGHT = Mask(key_valid_BS=PAD, causal=True, right_padded=True)
LONG = 1024  # T = S = 1024: the dense scores over the budget in the table (OVER), sampled statistics rows
OVER = {LONG}  # the lengths at which the table's dense_bytes exceed budget_bytes

# (requested, capability, platform, dtype, head_dim, mask, T, S) -> the backend, or the refusal's reason.
TABLE = [
    ("auto", SOFTMAX, "gpu", BF16, 64, RIGHT, 8, 8, "cudnn"),
    ("auto", SOFTMAX, "gpu", BF16, 64, Mask(causal=True, window=4), 8, 8, "cudnn"),
    ("auto", SOFTMAX, "gpu", F32, 64, RIGHT, 8, 8, "dense"),  # float32: no cuDNN flash kernel
    ("auto", SOFTMAX, "gpu", F32, 64, RIGHT, LONG, LONG, "blockwise"),
    ("auto", SOFTMAX, "gpu", BF16, 60, RIGHT, 8, 8, "dense"),  # head dim not a multiple of 8
    ("auto", SOFTMAX, "gpu", BF16, 256, RIGHT, LONG, LONG, "blockwise"),  # head dim over 128
    ("auto", SOFTMAX, "gpu", BF16, 64, Mask(key_valid_BS=PAD, causal=True), 8, 8, "dense"),  # padding, not right
    ("auto", SOFTMAX, "gpu", BF16, 64, Mask(dense_BNTS=jnp.ones((1, 2, 8, 8), bool)), LONG, LONG, "dense"),
    ("auto", SOFTMAX, "gpu", BF16, 64, Mask(window=4), 8, 8, "dense"),  # bidirectional window: not cuDNN
    ("auto", SOFTMAX, "gpu", BF16, 64, Mask(causal=True), 8, 16, "dense"),  # causal, T ≠ S
    ("auto", SOFTMAX, "gpu", BF16, 64, Mask(), 8, 16, "cudnn"),  # cross-attention without causality
    ("auto", SOFTMAX, "cpu", BF16, 64, RIGHT, 8, 8, "dense"),
    ("auto", SOFTMAX, "cpu", F32, 64, RIGHT, LONG, LONG, "blockwise"),
    ("auto", SOFTMAX, "tpu", BF16, 64, RIGHT, LONG, LONG - 1, "dense"),  # within the budget
    ("auto", KL_RECENCY, "gpu", BF16, 64, RIGHT, 8, 8, "dense"),
    ("auto", KL_RECENCY, "gpu", BF16, 64, RIGHT, LONG, LONG, "blockwise"),
    ("auto", ENTMAX, "gpu", BF16, 64, RIGHT, LONG, LONG, "dense"),
    ("xla", SOFTMAX, "cpu", F32, 5, Mask(key_valid_BS=PAD, window=3, right_padded=True), 8, 8, "xla"),
    ("xla", SOFTMAX, "cpu", F32, 5, Mask(key_valid_BS=PAD, right_padded=True), 8, 3, "xla"),
    ("blockwise", SOFTMAX, "gpu", BF16, 64, RIGHT, 8, 8, "blockwise"),
    ("dense", SOFTMAX, "gpu", BF16, 64, RIGHT, LONG, LONG, "dense"),
    ("dense", ENTMAX, "cpu", F32, 64, Mask(), 8, 8, "dense"),
    # refusals: one line naming the reason
    ("cudnn", SOFTMAX, "cpu", BF16, 64, RIGHT, 8, 8, "platform cpu"),
    ("cudnn", SOFTMAX, "gpu", F32, 64, RIGHT, 8, 8, "dtype float32"),
    ("cudnn", SOFTMAX, "gpu", BF16, 12, RIGHT, 8, 8, "head dim 12"),
    ("cudnn", SOFTMAX, "gpu", BF16, 64, Mask(dense_BTS=jnp.ones((2, 8, 8), bool)), 8, 8, "explicit (B,T,S) mask"),
    ("cudnn", SOFTMAX, "gpu", BF16, 64, Mask(window=3), 8, 8, "bidirectional window"),
    ("cudnn", KL_RECENCY, "gpu", BF16, 64, RIGHT, 8, 8, "only softmax and kl with prior=uniform"),
    ("xla", SOFTMAX, "cpu", F32, 64, Mask(dense_BNTS=jnp.ones((1, 2, 8, 8), bool)), 8, 8, "per-head dense mask"),
    ("xla", SOFTMAX, "cpu", F32, 64, Mask(key_valid_BS=PAD), 8, 8, "not right padding"),
    ("xla", SOFTMAX, "cpu", F32, 64, Mask(causal=True), 4, 8, "T=4 != S=8"),
    ("blockwise", ENTMAX, "cpu", F32, 64, Mask(), 8, 8, "no blockwise form"),
    ("blockwise", SOFTMAX, "cpu", F32, 64, Mask(dense_BNTS=jnp.ones((1, 2, 8, 8), bool)), 8, 8, "per-head"),
]


@pytest.mark.parametrize("requested, cap, platform, dtype, H, mask, T, S, expected", TABLE)
def test_the_choice_is_a_pure_function_of_its_arguments(requested, cap, platform, dtype, H, mask, T, S, expected):
    over = T in OVER and S in OVER
    args = dict(normalizer="softmax", platform=platform, dtype=dtype, head_dim=H, mask=mask, T=T, S=S)
    args.update(dense_bytes=2 if over else 1, budget_bytes=1)
    if expected in impl.backends(impl.SCORE):
        assert impl.choose(requested, cap, **args).name == expected
    else:
        with pytest.raises(
            ValueError, match=rf"^normalizer\.impl={requested} cannot run for softmax: .*{re.escape(expected)}"
        ) as e:
            impl.choose(requested, cap, **args)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "name, opts, value, allowed",
    [
        ("relu", {}, "xla", "auto, blockwise, dense, pallas"),
        ("kl", {"prior": "recency"}, "cudnn", "auto, blockwise, dense"),
        ("entmax", {}, "blockwise", "auto, dense"),  # no blockwise form: its threshold needs each whole row
        ("softmax", {}, "flash", None),  # no such backend: the refusal lists what the table offers softmax
    ],
)
def test_impl_a_normalizer_cannot_run_is_refused_when_built(name, opts, value, allowed):
    if allowed is None:
        allowed = ", ".join(impl.allowed(config.normalizer(name, num_heads=2, head_dim=8, **opts).capability()))
        assert {"cudnn", "xla", "blockwise", "dense"} <= set(allowed.split(", "))
    with pytest.raises(ValueError, match=rf"normalizer\.impl='{value}' is invalid; allowed: {allowed}$"):
        config.normalizer(name, num_heads=2, head_dim=8, impl=value, **opts)


def test_cudnn_on_cpu_is_a_one_line_error_naming_the_platform():
    q = jnp.ones((1, 2, 8, 8), jnp.bfloat16)
    norm = config.normalizer("softmax", num_heads=2, head_dim=8, impl="cudnn")
    with pytest.raises(ValueError, match=r"normalizer\.impl=cudnn cannot run for softmax: platform cpu"):
        norm(q, q, q, Mask(causal=True))


def out_and_grads(name, impl_, q, k, v, mask, opts):
    """Output and the gradients wrt q, k, v and the normalizer's parameters (β) of sum(out · cos)."""
    norm = config.normalizer(name, num_heads=q.shape[1], head_dim=q.shape[3], impl=impl_, **opts)
    norm.beta.theta[...] = jnp.log(jnp.array([0.3, 0.5, 0.9]))  # distinct β per head, not the default
    graphdef, params, rest = nnx.split(norm, nz.NormalizerParam, ...)
    ct = jnp.cos(jnp.arange(q.size, dtype=jnp.float32).reshape(q.shape))

    def loss(params, q, k, v):
        out = nnx.merge(graphdef, params, rest)(q, k, v, mask)[0]
        return jnp.sum(out * ct), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True))(params, q, k, v)
    return out, grads


def lengths_mask(lengths, S, **kw):
    return Mask(key_valid_BS=jnp.arange(S)[None] < jnp.array(lengths)[:, None], right_padded=True, **kw)


# (T, S, key lengths per batch row, causal, window); a length of 0 leaves whole rows with no admissible key.
SCENARIOS = {
    "causal_padded": (11, 11, [11, 6, 0], True, None),
    "bidirectional_padded": (11, 11, [11, 1, 7], False, None),
    "causal_window": (11, 11, [11, 9, 3], True, 4),
    "bidirectional_window": (11, 11, [4, 11, 2], False, 3),  # padded queries beyond the window see no key
    "cross_T_ne_S": (5, 13, [13, 7, 1], False, None),
}


@pytest.mark.numerics
@pytest.mark.parametrize("name, opts", [("softmax", {}), ("kl", {"prior": "uniform"})])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_xla_path_equals_the_dense_form_forward_and_gradients(name, opts, scenario):
    T, S, lengths, causal, window = SCENARIOS[scenario]
    rng = np.random.default_rng(7)
    q = jnp.asarray(rng.normal(size=(3, 3, T, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(3, 3, S, 8)), jnp.float32) for _ in range(2))
    mask = lengths_mask(lengths, S, causal=causal, window=window)
    assert config.normalizer(name, num_heads=3, head_dim=8, impl="xla", **opts).backend(T, S, mask, F32).name == "xla"
    out_x, g_x = out_and_grads(name, "xla", q, k, v, mask, opts)
    out_d, g_d = out_and_grads(name, "dense", q, k, v, mask, opts)
    np.testing.assert_allclose(out_x, out_d, atol=2e-6, rtol=1e-5)
    empty_BT = ~np.asarray(mask.matrix_B1TS(T, S))[:, 0].any(-1)
    np.testing.assert_array_equal(np.asarray(out_x)[empty_BT.nonzero()[0], :, empty_BT.nonzero()[1]], 0.0)
    for a, b in zip(jax.tree.leaves(g_x), jax.tree.leaves(g_d)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    assert np.abs(np.asarray(jax.tree.leaves(g_x[0])[0])).min() > 1e-3  # dβ (the only parameter) is exercised


# Every normalizer: (the impl values it accepts; auto within the memory budget on cpu, gpu; auto over it on cpu,
# gpu), at bfloat16, head dim 64, a causal right-padded mask. tpu chooses as cpu (no cuDNN).
EVERY = {
    "softmax": ("auto cudnn xla blockwise dense", "dense", "cudnn", "blockwise", "cudnn"),
    "kl": ("auto blockwise dense", "dense", "dense", "blockwise", "blockwise"),  # the recency prior: a bias
    "softmax1": ("auto blockwise dense", "dense", "dense", "blockwise", "blockwise"),
    "sigmoid": ("auto blockwise dense pallas", "dense", "dense", "blockwise", "blockwise"),
    "relu": ("auto blockwise dense pallas", "dense", "dense", "blockwise", "blockwise"),
    "squared": ("auto blockwise dense", "dense", "dense", "blockwise", "blockwise"),
    "ssmax": ("auto blockwise dense", "dense", "dense", "blockwise", "blockwise"),
    "stickbreaking": ("auto blockwise dense", "dense", "dense", "blockwise", "blockwise"),
    "softpick": ("auto blockwise dense", "dense", "dense", "blockwise", "blockwise"),
    "differential": ("auto blockwise dense", "dense", "dense", "blockwise", "blockwise"),
    "sink": ("auto blockwise dense", "dense", "dense", "blockwise", "blockwise"),
    "forgetting": ("auto blockwise dense", "dense", "dense", "blockwise", "blockwise"),
    "entmax": ("auto dense", "dense", "dense", "dense", "dense"),  # no blockwise form
    "linear": ("auto chunked parallel pallas", "parallel", "parallel", "chunked", "chunked"),  # one chunk at T=8
}
# A normalizer added later, not pinned above, takes the generic backends: dense, and blockwise where it has a
# blockwise form.
GENERIC = {
    True: ("auto blockwise dense", "dense", "dense", "blockwise", "blockwise"),
    False: ("auto dense", "dense", "dense", "dense", "dense"),
}
# The impl values EVERY speaks of (a backend added later is pinned by its own test), and one no backend has.
EVERY_IMPL = dict.fromkeys([x for accepts, *_ in EVERY.values() for x in accepts.split()] + ["flash"])


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("requested", list(EVERY_IMPL))
@pytest.mark.parametrize("name", registry.choices("normalizer"))
def test_every_normalizer_impl_and_platform_chooses_its_backend_or_refuses_in_one_line(name, requested, platform):
    norm = config.normalizer(name, num_heads=2, head_dim=64)
    cap = norm.capability()
    assert set(EVERY) <= set(registry.choices("normalizer"))  # no pin outlives its normalizer
    accepts, *auto = EVERY.get(name) or GENERIC["blockwise" in impl.allowed(cap)]
    assert tuple(x for x in impl.allowed(cap) if x in EVERY_IMPL) == tuple(accepts.split())
    for over, T in ((False, 8), (True, LONG)):
        args = dict(normalizer=name, platform=platform, dtype=BF16, head_dim=64, mask=RIGHT, T=T, S=T)
        args.update(dense_bytes=2 if over else 1, budget_bytes=1)
        if requested not in accepts.split():
            listed = ", ".join(impl.allowed(cap))
            expected = f"^normalizer\\.impl={requested} cannot run for {name}: .*; allowed here: {listed}$"
        elif requested == "cudnn" and platform != "gpu":
            expected = f"^normalizer\\.impl=cudnn cannot run for {name}: platform {platform} \\(cuDNN needs gpu\\)$"
        elif requested == "pallas" and platform != "gpu":
            expected = f"^normalizer\\.impl=pallas cannot run for {name}: platform {platform} \\(.*compiled for gpu\\)$"
        else:
            expected = auto[2 * over + (platform == "gpu")] if requested == "auto" else requested
        if expected.startswith("^"):
            with pytest.raises(ValueError, match=expected):
                impl.choose(requested, norm.capability(), **args)
        else:
            assert impl.choose(requested, norm.capability(), **args).name == expected, (T, platform)


def test_the_dense_score_bytes_and_the_default_budgets_are_the_documented_ones():
    """B·N·T·S × 8 bytes (float32 z and w) × the layers the backward holds, by hand; budgets of an unreporting
    device."""
    assert impl.dense_score_bytes(impl.Workload(batch=3, heads=5, layers=2), 7, 11) == 3 * 5 * 7 * 11 * 8 * 2 == 18480
    assert impl.dense_score_bytes(impl.Workload(batch=1, heads=1), 1024, 1024) == 8 * 2**20
    assert impl.memory_budget("cpu") == 2**30  # a CPU's memory is the host's: always the default
    assert impl.memory_budget("gpu") == 10 * 2**30  # no GPU device here (a deviceless compile): the default


def tiny_transformer(makers, **kw):
    from attnlab.model import Transformer

    return Transformer(
        d_model=16,
        heads=2,
        layers=3,
        mlp_ratio=2,
        dropout=0.0,
        positional="rope",
        max_len=8,
        causal=True,
        qk_norm=False,
        pooled=False,
        make_normalizer=makers,
        seq_len=8,
        vocab_size=5,
        rngs=nnx.Rngs(0),
        **kw,
    )


def test_the_model_chooses_each_layers_backend_at_build_by_the_memory_budget():
    """B=32, N=2, 3 layers at T=1024: 32·2·1024²·8·3 = 1.5 GiB of dense scores > the CPU's 1 GiB: blockwise; under
    remat=true one layer's, 0.5 GiB: dense. At T=8 dense; the fused layers take the impl they were given."""
    makers = [lambda **kw: config.normalizer("softmax", impl="xla", **kw), lambda **kw: config.normalizer("relu", **kw)]
    net = tiny_transformer(makers, batch_size=32, test_lengths=[LONG])
    assert impl.dense_score_bytes(impl.Workload(32, 2, 3), LONG, LONG) == 3 * 2**29 > impl.memory_budget("cpu")
    assert net.attention_impl(8) == ["xla", "dense", "xla"]
    assert net.attention_impl(LONG) == ["xla", "blockwise", "xla"]
    assert [(t, s, b.name) for t, s, b in net.blocks[1].attn.normalizer.backends] == [
        (8, 8, "dense"),
        (LONG, LONG, "blockwise"),
    ]
    remat = tiny_transformer(makers, batch_size=32, test_lengths=[LONG], remat=True)
    assert remat.attention_impl(LONG) == ["xla", "dense", "xla"]


def test_a_refused_impl_is_refused_when_the_model_is_built():
    makers = [lambda **kw: config.normalizer("softmax", impl="cudnn", **kw)]
    with pytest.raises(ValueError, match=r"^normalizer\.impl=cudnn cannot run for softmax: platform cpu"):
        tiny_transformer(makers, batch_size=2)


def relu_run(monkeypatch, budget_at_build: int, budget_after: int) -> dict:
    """bench_gpu.attnlab_run (assembly.assemble, compute_record, the compiled plain and logging steps, as a run) of a
    relu model at T=16, blocks of 8, under a CPU budget that changes once the model is built."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_gpu

    from attnlab.config import assembly

    real_build = assembly.assemble

    def build_then_change_the_budget(*args, **kwargs):
        built = real_build(*args, **kwargs)
        monkeypatch.setitem(impl.DEFAULT_BUDGET_BYTES, "cpu", budget_after)
        return built

    monkeypatch.setitem(impl.DEFAULT_BUDGET_BYTES, "cpu", budget_at_build)
    monkeypatch.setattr(assembly, "assemble", build_then_change_the_budget)
    overrides = ["accelerator=cpu", "model=tiny", "task=mqar", "task.seq_len=16", "trainer.batch_size=2"]
    options = ["normalizer=relu", "normalizer.block_size=8", "task.n_train=8", "task.n_val=4", "task.n_test=4"]
    return bench_gpu.attnlab_run(overrides + options)


def test_plain_step_logging_step_and_run_json_read_the_choice_made_at_build(monkeypatch):
    """A budget that sends relu blockwise while the model is built, then grows so that a new choice would be dense:
    run.json's attention_impl says blockwise, and neither the compiled plain step nor the logging step's program
    holds a B×N×T×T array (f32[2,2,16,16]), which the dense run's programs do. Statistics rows are sampled (4 of
    them) at every length here, so the logging step runs the plain step's backend rather than probing the scores."""
    from attnlab.backends import sampled_rows

    monkeypatch.setattr(sampled_rows, "SAMPLED_MIN_TS", 0)
    monkeypatch.setattr(sampled_rows, "STATS_ROWS", 4)
    txt = re.compile(r"f32\[2,2,16,16\]")
    run = relu_run(monkeypatch, budget_at_build=0, budget_after=2**62)
    assert impl.memory_budget("cpu") == 2**62 and run["impl"] == ["blockwise"]
    assert [len(txt.findall(p.as_text())) for p in (run["steps"].train_program, run["statistics"])] == [0, 0]
    dense = relu_run(monkeypatch, budget_at_build=2**62, budget_after=0)
    assert dense["impl"] == ["dense"]
    assert all(txt.search(p.as_text()) for p in (dense["steps"].train_program, dense["statistics"]))


@pytest.mark.numerics
def test_xla_path_in_bfloat16_keeps_beta_gradient_close_to_float32():
    """bfloat16 q, k, v: the output and dβ (reduced in float32) stay near the float32 dense form."""
    T, S, lengths, causal, window = SCENARIOS["causal_padded"]
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.normal(size=(3, 3, T, 8)), jnp.float32) for _ in range(3))
    mask = lengths_mask(lengths, S, causal=causal, window=window)
    out16, g16 = out_and_grads("softmax", "xla", *(x.astype(jnp.bfloat16) for x in (q, k, v)), mask, {})
    out32, g32 = out_and_grads("softmax", "dense", q, k, v, mask, {})
    assert out16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out16, np.float32), out32, atol=5e-2)
    beta16, beta32 = (np.asarray(jax.tree.leaves(g[0])[0], np.float32) for g in (g16, g32))
    np.testing.assert_allclose(beta16, beta32, rtol=5e-2, atol=5e-2)


def seeds_out_and_grads(impl_, q_VBNTH, k_VBNSH, v_VBNSH, log_beta_VN, mask, mask_axis):
    """vmap over a leading seed axis of (out, d/dq, d/dk, d/dv, d log β) of sum(out · cos) through fused_attention."""
    from attnlab.backends.fused import fused_attention

    ct = jnp.cos(jnp.arange(q_VBNTH[0].size, dtype=jnp.float32).reshape(q_VBNTH[0].shape))

    def loss(q, k, v, log_beta, mask):
        out = fused_attention(q, k, v, mask, log_beta, impl_)
        return jnp.sum(out.astype(jnp.float32) * ct), out

    grad = jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True)
    return jax.jit(jax.vmap(grad, in_axes=(0, 0, 0, 0, mask_axis)))(q_VBNTH, k_VBNSH, v_VBNSH, log_beta_VN, mask)


@pytest.mark.numerics
@pytest.mark.parametrize("scenario", ["causal_padded", "causal_window"])
@pytest.mark.parametrize("per_seed_mask", [False, True])
def test_vmapped_seeds_of_the_fused_path_equal_each_seed_alone(scenario, per_seed_mask):
    """trainer.vmap_seeds: two seeds' queries, keys, values and β vmapped over key lengths shared by the seeds
    (the lm stream's all-valid batch) or one set per seed give each seed's output and gradients alone, up to
    float32 rounding (XLA's CPU dot with a seed batch axis sums in another order); a seed attending with
    the other seed's lengths would differ by O(1)."""
    T, S, lengths, causal, window = SCENARIOS[scenario]
    rng = np.random.default_rng(11)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 3, 3, T, 8)), jnp.float32) for _ in range(3))
    log_beta_VN = jnp.asarray([[0.3, 0.5, 0.9], [1.1, 0.7, 0.2]], jnp.float32)
    masks = [
        lengths_mask(lengths, S, causal=causal, window=window),
        lengths_mask(lengths[::-1], S, causal=causal, window=window),
    ]
    mask = jax.tree.map(lambda *m: jnp.stack(m), *masks) if per_seed_mask else masks[0]
    (_, out), grads = seeds_out_and_grads("xla", q, k, v, log_beta_VN, mask, 0 if per_seed_mask else None)
    for seed in range(2):
        one = jax.tree.map(lambda x, seed=seed: x[seed : seed + 1], (q, k, v, log_beta_VN))
        (_, out1), grads1 = seeds_out_and_grads("xla", *one, masks[seed if per_seed_mask else 0], None)
        np.testing.assert_allclose(out[seed], out1[0], rtol=1e-5, atol=1e-6)
        for a, b in zip(grads, grads1):
            np.testing.assert_allclose(a[seed], b[0], rtol=1e-5, atol=1e-5)
    assert not np.array_equal(out[0], out[1])  # the seeds differ


@pytest.mark.gpu_program
def test_vmapped_seeds_lower_to_cudnn_attention_for_cuda():
    """Seeds vmapped over shared key lengths (jax 0.10's cuDNN batching rule once failed: "cannot reshape")
    lower for CUDA, deviceless, to cuDNN flash attention forward and backward, per-seed lengths as operands."""
    pytest.importorskip("jax_cuda12_plugin", reason="needs the CUDA plugin (make test-gpu-program)")
    T, S, lengths, causal, window = SCENARIOS["causal_padded"]
    q, k, v = (jnp.ones((2, 3, 3, 16, 64), BF16) for _ in range(3))
    mask = lengths_mask(lengths, 16, causal=True)
    fn = jax.jit(lambda *a: seeds_out_and_grads("cudnn", *a, mask, None))
    exported = jax.export.export(
        fn, platforms=["cuda"], disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("ALL")]
    )(q, k, v, jnp.ones((2, 3), F32))
    calls = re.findall(r"__cudnn\$fmha\w+", exported.mlir_module())
    assert sorted(set(calls)) == ["__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"], calls


@pytest.mark.numerics
def test_statistics_at_length_keep_the_fused_output_and_the_sampled_row_statistics():
    """A logging step at length on the fused path: the output is the plain step's (XLA here, cuDNN's flash
    kernel on a GPU; not blockwise loops) and the statistics are those of the sampled rows, as blockwise."""
    rng = np.random.default_rng(4)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 3, LONG, 8)), jnp.float32) for _ in range(3))
    mask = Mask(causal=True)
    fused, block = (config.normalizer("softmax", num_heads=3, head_dim=8, impl=i) for i in ("xla", "blockwise"))
    assert fused.backend(LONG, LONG, mask, F32).name == "xla"
    out, stats = jax.jit(lambda q, k, v: fused(q, k, v, mask, with_stats=True))(q, k, v)
    plain, _ = jax.jit(lambda q, k, v: fused(q, k, v, mask))(q, k, v)
    np.testing.assert_array_equal(out, plain)
    out_b, stats_b = jax.jit(lambda q, k, v: block(q, k, v, mask, with_stats=True))(q, k, v)
    np.testing.assert_allclose(out, out_b, atol=1e-5)
    assert set(stats) == set(stats_b)
    for name in stats:
        np.testing.assert_array_equal(stats[name], stats_b[name], err_msg=name)


def test_the_cli_build_records_the_backend_at_the_training_length_and_each_test_length(monkeypatch):
    """assembly.assemble passes the per-device batch (batch × seeds / devices) and the task's test lengths to the model:
    8 sequences × 2 heads × T² × 8 bytes × 1 layer is 32 KiB at T=16 and 128 KiB at T=32, so a budget one byte
    under 128 KiB keeps T=16 dense and sends 32 and 64 blockwise (with the seeds left out, T=32 would fit)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_gpu

    from attnlab.config.assembly import assemble

    monkeypatch.setitem(impl.DEFAULT_BUDGET_BYTES, "cpu", 8 * 2 * 32 * 32 * 8 - 1)
    overrides = ["accelerator=cpu", "model=tiny", "task=mqar", "task.seq_len=16", "task.test_lengths=[32,64]"]
    cfg = bench_gpu.compose([*overrides, "normalizer=relu", "trainer.batch_size=4", "trainer.vmap_seeds=2"])
    _, nets, _, _ = assemble(cfg, cfg.task.default_head)
    expected = [(16, 16, "dense"), (32, 32, "blockwise"), (64, 64, "blockwise")]
    backends = [[(t, s, b.name) for t, s, b in net.body.blocks[0].attn.normalizer.backends] for net in nets]
    assert backends == [expected, expected]


def offering(backend: impl.Backend):
    """(name, built normalizer) of the first registered normalizer with `backend`'s form, blocks and chunks of 8
    keys (so a T×T array at T = 32 is the backend's, not one block's); None where no normalizer has it."""
    import normalizer_refs as R

    for name in registry.choices("normalizer"):
        options = registry.load("normalizer", name)  # the YAML's keys
        small = {key: 8 for key in ("block_size", "chunk_size") if key in options}
        norm = config.normalizer(name, num_heads=R.N, head_dim=R.H, **small)
        capability = norm.capability()
        if capability.family == backend.family and backend.lacks(capability) is None:
            return name, norm
    return None


def holds_txt(hlo: str, T: int) -> bool:
    """Whether an optimized HLO module has an array with two dimensions of size T."""
    return any([int(d) for d in dims.split(",")].count(T) >= 2 for dims in re.findall(r"\[([\d,]+)\]", hlo))


@pytest.mark.parametrize("backend", impl.TABLE, ids=lambda b: f"{b.family}-{b.name}")
def test_every_backend_of_the_table_computes_the_float64_reference_and_keeps_a_txs_array_as_it_says(backend):
    """Each entry's `run` on the first normalizer that offers it, at T = S = 32 on a CPU with the first mask it takes
    (causal, else none), against the normalizer's float64 reference weights times v; the compiled forward and
    backward hold a 32×32 array exactly where the entry says it keeps one. GPU-only entries (cudnn, pallas) are
    tested by the GPU program and on-device tests."""
    import normalizer_refs as R

    T = 32
    found = offering(backend)
    assert found is not None, f"no registered normalizer offers {backend.name}"
    name, norm = found
    site = [impl.Site("cpu", F32, R.H, m, T, T) for m in (Mask(causal=True), Mask())]
    site = next((s for s in site if backend.problem(norm.capability(), s) is None), None)
    if site is None:
        pytest.skip(f"{backend.name} runs on a GPU only")
    q, k, v = R.qkv(5, T, T)
    q_BNTH, k_BNSH, v_BNSH = (jnp.swapaxes(jnp.asarray(x), 1, 2) for x in (q, k, v))
    run = jax.jit(lambda q, k, v: backend.run(norm, q, k, v, site.mask))
    m_BTS = R.admissible(R.B, T, T, causal=site.mask.causal)
    w_BNTS = R.reference(norm, q, k, m_BTS)[0]  # the normalizer's float64 `reference` method
    expected_BNTH = R.output(norm, w_BNTS, v_BNSH)  # w·v, or its own reference_output (differential)
    np.testing.assert_allclose(run(q_BNTH, k_BNSH, v_BNSH), expected_BNTH, atol=2e-5, rtol=1e-4)
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(jnp.sin(backend.run(norm, q, k, v, site.mask))), (0, 1, 2)))
    assert holds_txt(grad.lower(q_BNTH, k_BNSH, v_BNSH).compile().as_text(), T) == backend.keeps_scores


def test_the_table_names_each_backend_once_per_family_and_lists_the_impl_values_in_its_order():
    """The refusal texts' `allowed here` lists and the YAML-side choices come from the table's order."""
    names = [(b.family, b.name) for b in impl.TABLE]
    assert len(names) == len(set(names))
    known = ("auto", "cudnn", "xla", "blockwise", "dense", "pallas", "chunked", "parallel")
    assert [x for x in impl.requestable(impl.SCORE) if x in known] == [
        "auto",
        "cudnn",
        "xla",
        "blockwise",
        "dense",
        "pallas",
    ]
    assert [x for x in impl.requestable(impl.LINEAR) if x in known] == ["auto", "chunked", "parallel", "pallas"]
