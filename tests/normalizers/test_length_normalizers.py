"""The normalizers proposed against softmax's dispersion at length: closed forms from their papers, parameters
away from their initial values against the float64 references, and gradients against finite differences."""

import math
import re

import jax
import jax.numpy as jnp
import normalizer_refs as R
import numpy as np
import pytest
from flax import nnx

pytestmark = pytest.mark.numerics

ATOL, RTOL = 2e-5, 1e-4


def spike_row(n, pad=0):
    """Scores (1,1,1,n+pad) of n−1 keys at −2 and the last admissible one at +3, then `pad` padded keys,
    and its mask: the row of Nakanishi 2025, Figure 1."""
    z = np.full((1, 1, 1, n + pad), -2.0, np.float32)
    z[..., n - 1] = 3.0
    z[..., n:] = 50.0  # padded keys with a large score, which must get no weight
    m = np.zeros((1, 1, 1, n + pad), bool)
    m[..., :n] = True
    return jnp.asarray(z), jnp.asarray(m)


def max_weight(name, n, pad=0, **opts):
    norm = R.config.normalizer(name, num_heads=1, head_dim=4, beta=1.0, **opts)
    z, m = spike_row(n, pad)
    adapts = getattr(norm, "adaptive", "off") != "off"
    w = np.asarray((norm.tempered if adapts else norm.normalize)(z, m)[0])  # with adaptive temperature: at evaluation
    assert (w[..., n:] == 0).all()
    return float(w.max())


def test_softmax_disperses_and_ssmax_does_not_on_the_papers_row():
    """Nakanishi 2025 (Fig. 1): softmax's largest weight on −2s with one +3 is 1/(1 + (n−1)e⁻⁵): 0.94 at n = 10,
    0.13 at n = 1000; SSMax's is 1/(1 + (n−1)·n^{−5s}), ≈ 1 at n = 1000 for the paper's s = 0.43."""
    for n, printed in [(10, 0.94), (1000, 0.13)]:
        soft = max_weight("softmax", n, pad=3)
        assert soft == pytest.approx(1 / (1 + (n - 1) * math.exp(-5)), rel=1e-5)
        assert round(soft, 2) == printed
        ss = max_weight("ssmax", n, pad=3, s=0.43)
        assert ss == pytest.approx(1 / (1 + (n - 1) * n ** (-5 * 0.43)), rel=1e-5)
    assert max_weight("ssmax", 1000, s=0.43) > 0.999 > max_weight("ssmax", 10, s=0.43) > 0.93
    # s = 1/log n is plain softmax at that n
    assert max_weight("ssmax", 100, s=1 / math.log(100)) == pytest.approx(max_weight("softmax", 100), rel=1e-5)


def _set(module, **values):
    for name, value in values.items():
        getattr(module.inner, name)[...] = jnp.asarray(value, jnp.float32)


def test_ssmax_per_head_s_and_bias_match_the_reference():
    s, b = np.array([0.2, 0.9, 1.7]), np.array([0.3, -0.5, 0.1])
    for kind in ("causal_pad", "dense"):
        T, S, mask, m = R.make_mask(kind)
        q, k, v = R.qkv(41, T, S)
        norm = R.build("ssmax", {"bias": True})
        _set(norm, s=s, b=b)
        w_ref, _, extras = R.reference(norm, q, k, m)
        np.testing.assert_allclose(np.asarray(norm.weights(q, k, mask)), w_ref, atol=ATOL, rtol=RTOL)
        stats = norm(q, k, v, mask, with_stats=True)[1]
        for key in ("s", "bias", "beta"):
            np.testing.assert_allclose(np.asarray(stats[key]), extras[key], atol=ATOL, rtol=RTOL, err_msg=key)


def finite_difference(f, x, h=1e-6):
    """Central differences of a float64 scalar function f at x, one coordinate at a time."""
    x = np.asarray(x, np.float64)
    return np.array([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(x.size)]).reshape(x.shape)


def test_ssmax_gradients_match_finite_differences_of_the_reference():
    """d(Σ c·w)/dz per row and d/ds, d/db per head, against central differences of the float64 reference."""
    T, S, mask, m = R.make_mask("causal_pad")
    q, k, _ = R.qkv(42, T, S)
    s, b = np.array([0.5, 1.1, 0.3]), np.array([0.2, -0.1, 0.4])
    norm = R.build("ssmax", {"bias": True, "beta": 0.7})
    _set(norm, s=s, b=b)
    z = R.scores(q, k).astype(np.float32)
    c = np.random.default_rng(43).normal(size=z.shape)
    m_B1TS = mask.matrix_B1TS(T, S)

    graphdef, params, rest = nnx.split(norm.inner, R.nz.NormalizerParam, ...)

    def loss(z, params):
        return jnp.sum(nnx.merge(graphdef, params, rest).normalize(z, m_B1TS)[0] * c)

    gz, gp = jax.grad(loss, (0, 1))(jnp.asarray(z), params)
    gs, gb = gp["s"][...], gp["b"][...]

    def ref_loss(z=z, s=s, b=b):
        w = R.rowwise(lambda r, bb, n, t, idx: R.softmax_np(0.7 * (s[n] * math.log(idx.size) + b[n]) * r), z, m)
        return float(np.sum(w * c))

    np.testing.assert_allclose(np.asarray(gs), finite_difference(lambda s: ref_loss(s=s), s), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gb), finite_difference(lambda b: ref_loss(b=b), b), rtol=1e-3, atol=1e-4)
    for bb, n, t in [(0, 1, 5), (1, 2, 12)]:

        def row_loss(r, bb=bb, n=n, t=t):
            zz = z.astype(np.float64).copy()
            zz[bb, n, t] = r
            return ref_loss(z=zz)

        np.testing.assert_allclose(
            np.asarray(gz)[bb, n, t], finite_difference(row_loss, z[bb, n, t]), rtol=1e-3, atol=1e-4
        )


def test_stickbreaking_closed_form_on_equal_scores():
    """Equal scores x on a causal row: key j (i−1−j keys more recent, the query's own left out) gets
    σ(x)(1 − σ(x))^{i−1−j}, the most recent the most, and (1 − σ(x))^{i} is left over (Tan et al. 2024)."""
    T, x = 9, 0.7
    q = jnp.ones((1, 1, T, 4)) * (x / 2)  # β·q·k = 0.5 · 4 · x/2 = x
    k = jnp.ones((1, 1, T, 4))
    norm = R.config.normalizer("stickbreaking", num_heads=1, head_dim=4, beta=0.5)
    w = np.asarray(norm.weights(q, k, R.nz.Mask(causal=True)))[0, 0]
    sig = 1 / (1 + math.exp(-x))
    expected = np.array([[sig * (1 - sig) ** (i - 1 - j) if j < i else 0.0 for j in range(T)] for i in range(T)])
    np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-7)
    _, stats = norm(q, k, k, R.nz.Mask(causal=True), with_stats=True)
    leftover = np.mean([(1 - sig) ** i for i in range(T)])  # row 0 has no key: the whole stick is left
    np.testing.assert_allclose(float(stats["leftover"][0]), leftover, rtol=1e-5)
    with_current = R.config.normalizer("stickbreaking", num_heads=1, head_dim=4, beta=0.5, attend_current=True)
    w_cur = np.asarray(with_current.weights(q, k, R.nz.Mask(causal=True)))[0, 0]
    np.testing.assert_allclose(np.diag(w_cur), sig, rtol=1e-5)  # its own position breaks first


def test_stickbreaking_gradients_match_finite_differences_of_the_reference():
    T, S, mask, m = R.make_mask("causal_cross")
    q, k, _ = R.qkv(44, T, S)
    norm = R.build("stickbreaking", {"beta": 0.9})
    z = R.scores(q, k).astype(np.float32)
    c = np.random.default_rng(45).normal(size=z.shape)
    graphdef, params, rest = nnx.split(norm.inner, R.nz.NormalizerParam, ...)

    def loss(z, params):
        return jnp.sum(nnx.merge(graphdef, params, rest).normalize(z, mask.matrix_B1TS(T, S))[0] * c)

    gz, gp = jax.grad(loss, (0, 1))(jnp.asarray(z), params)

    def ref_loss(zz, beta=0.9):
        """Σ c·A of the product form (an independent float64 reference: no log space)."""
        x = beta * zz
        sig = lambda r: 1 / (1 + np.exp(-r))  # noqa: E731
        w = np.zeros_like(x)
        for b, n, t in np.ndindex(x.shape[:3]):
            idx = [s for s in np.flatnonzero(m[b, t]) if s != t + S - T]
            for a in idx:
                w[b, n, t, a] = sig(x[b, n, t, a]) * np.prod([1 - sig(x[b, n, t, s]) for s in idx if s > a])
        return float(np.sum(w * c))

    g_theta = np.asarray(gp["beta"]["theta"][...])  # β = exp(θ): dL/dθ = β·dL/dβ
    fd_beta = (ref_loss(z.astype(np.float64), 0.9 + 1e-6) - ref_loss(z.astype(np.float64), 0.9 - 1e-6)) / 2e-6
    np.testing.assert_allclose(g_theta.sum(), 0.9 * fd_beta, rtol=1e-3, atol=1e-4)
    for bb, n, t in [(0, 1, 4), (1, 2, 6)]:

        def row_loss(r, bb=bb, n=n, t=t):
            zz = z.astype(np.float64).copy()
            zz[bb, n, t] = r
            return ref_loss(zz)

        np.testing.assert_allclose(
            np.asarray(gz)[bb, n, t], finite_difference(row_loss, z[bb, n, t]), rtol=1e-3, atol=1e-4
        )


@pytest.mark.slow  # ~50 s on 2 cores: a subprocess run of two layers
def test_ssmax_and_stickbreaking_train_without_positions_and_log_their_statistics(tmp_path):
    """The README's example through the real entry point: a hybrid (layer 0 ssmax, layer 1 stick-breaking)
    with model.positional=none; s, the effective β and the leftover mass reach TensorBoard per layer and head."""
    from cli_helpers import TINY, events, metrics, tiny_task, train_in_process

    run_dir = tmp_path / "out"
    train_in_process(
        *TINY,
        *tiny_task("mqar"),
        "model.layers=2",
        "model.layer_normalizers=[ssmax,stickbreaking]",
        "normalizer=ssmax",
        "normalizer.bias=true",
        "model.positional=none",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert metrics(run_dir)["status"] == "completed"
    tags = events(run_dir).Tags()
    for tag in (
        "attn_s/layer_0/head_1",
        "attn_bias/layer_0/head_0",
        "attn_beta/layer_0/head_0",
        "attn_leftover/layer_1/head_1",
        "attn_beta/layer_1/head_0",
    ):
        assert tag in tags["scalars"], tag
    assert "attn_leftover/layer_0" not in tags["scalars"] and "attn_s/layer_1" not in tags["scalars"]
    leftover = [e.value for e in events(run_dir).Scalars("attn_leftover/layer_1")]
    assert leftover and all(0 < v <= 1 for v in leftover)
    assert "hist/beta" in tags["histograms"]


def test_stickbreaking_is_refused_for_bidirectional_models_naming_the_task():
    from cli_helpers import compose_train, tiny_task

    from attnlab.checks import ConfigError
    from attnlab.config.assembly import assemble

    def build(*overrides):
        return assemble(compose_train("model=tiny", "task=listops", *overrides, *tiny_task("listops")), "softmax_ce")

    with pytest.raises(ConfigError) as err:
        build("normalizer=stickbreaking")
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        "normalizer=stickbreaking needs causal attention, but task=listops is a per-sequence task"
    ), message
    assert "model.causal=null; allowed: a per-token task" in message, message
    with pytest.raises(ConfigError, match="normalizer=stickbreaking needs causal"):  # one layer of a hybrid
        build("model.layers=2", "model.layer_normalizers=[softmax,stickbreaking]")
    _, nets, _, _ = build("normalizer=stickbreaking", "model.causal=true")  # a causal per-sequence model is allowed
    assert nets[0].body.causal


def paper_row_entropy(n):
    """H (nats, with the paper's +1e−9 in the log) of softmax on −2s with one +3, and its largest weight."""
    top = 1 / (1 + (n - 1) * math.exp(-5))
    rest = top * math.exp(-5)
    return -top * math.log(top + 1e-9) - (n - 1) * rest * math.log(rest + 1e-9), top


def test_adaptive_temperature_on_the_papers_row_follows_the_polynomial():
    """Veličković et al. 2024's rule β' = max(poly(H), 1) where H > 0.5: on −2s with one +3 it leaves a sharp row
    (n = 10, H ≈ 0.34) alone, sharpens n = 100 (H ≈ 2.5, β' ≈ 2.2: 0.60 → 0.998), and does nothing at n = 1000,
    where H ≈ 6.4 lies past the fitted range and poly(H) < 1."""
    poly = lambda h: sum(a * h ** (4 - i) for i, a in enumerate(R.POLY_FIT))  # noqa: E731
    for n in (10, 100, 1000):
        h, top = paper_row_entropy(n)
        beta = max(poly(h), 1.0) if h > 0.5 else 1.0
        got = max_weight("softmax", n, pad=2, adaptive_temperature="eval")
        assert got == pytest.approx(1 / (1 + (n - 1) * math.exp(-5 * beta)), rel=1e-4), n
    assert paper_row_entropy(10)[0] < 0.5 and max_weight("softmax", 10, adaptive_temperature="eval") == pytest.approx(
        max_weight("softmax", 10), rel=1e-6
    )
    assert (
        round(max_weight("softmax", 100), 2) == 0.60 and max_weight("softmax", 100, adaptive_temperature="eval") > 0.99
    )
    assert poly(paper_row_entropy(1000)[0]) < 1
    assert max_weight("softmax", 1000, adaptive_temperature="train") == pytest.approx(max_weight("softmax", 1000))


def test_softmax_disperses_within_the_papers_bound():
    """Veličković et al. 2024, Lemma 2.1: logits within a spread δ give every softmax weight ≤ e^δ/(e^δ + n − 1),
    so the largest weight goes to 0 as n grows (δ = 4 here; the bound is attained by one key at the top)."""
    rng = np.random.default_rng(46)
    for n in (16, 256, 4096):
        z = rng.uniform(-2, 2, size=(1, 1, 1, n)).astype(np.float32)
        z[..., 0], z[..., 1:] = 2.0, np.clip(z[..., 1:], -2, 2)
        norm = R.config.normalizer("softmax", num_heads=1, head_dim=4, beta=1.0)
        w = np.asarray(norm.normalize(jnp.asarray(z), jnp.ones((1, 1, 1, n), bool))[0])
        bound = math.exp(4) / (math.exp(4) + n - 1)
        assert w.max() <= bound * (1 + 1e-5)
        z_tight = np.full_like(z, -2.0)
        z_tight[..., 0] = 2.0
        w_tight = np.asarray(norm.normalize(jnp.asarray(z_tight), jnp.ones((1, 1, 1, n), bool))[0])
        assert w_tight.max() == pytest.approx(bound, rel=1e-5)


@pytest.mark.parametrize("name,opts", [("softmax", {}), ("kl", {"prior": "recency", "slope": 0.3})])
def test_adaptive_temperature_applies_at_evaluation_or_also_in_training(name, opts):
    T, S, mask, m = R.make_mask("causal_pad")
    q, k, v = R.qkv(47, T, S)
    plain = R.build(name, opts)
    eval_only = R.build(name, {**opts, "adaptive_temperature": "eval"})
    always = R.build(name, {**opts, "adaptive_temperature": "train"})
    assert not plain.mode_dependent and eval_only.mode_dependent and always.mode_dependent
    w_ref, _, extras = R.reference(eval_only, q, k, m)
    assert extras["adaptive_beta"].max() > 1.2  # some rows were sharpened
    out_plain = np.asarray(plain(q, k, v, mask)[0])
    out_adapted = np.einsum("bnts,bsnh->btnh", w_ref, v.astype(np.float64))
    np.testing.assert_allclose(np.asarray(eval_only(q, k, v, mask, training=True)[0]), out_plain, atol=1e-6)
    for norm, training in [(eval_only, False), (always, True), (always, False)]:
        out, stats = norm(q, k, v, mask, training=training, with_stats=True)
        np.testing.assert_allclose(np.asarray(out), out_adapted, atol=ATOL, rtol=RTOL)
        np.testing.assert_allclose(np.asarray(stats["adaptive_beta"]), extras["adaptive_beta"], atol=ATOL, rtol=RTOL)
    assert "adaptive_beta" not in eval_only(q, k, v, mask, training=True, with_stats=True)[1]
    assert np.abs(out_adapted - out_plain).max() > 1e-2


@pytest.mark.parametrize("mode,differs", [("off", False), ("eval", True), ("train", False)])
def test_the_model_passes_training_to_the_normalizer(mode, differs):
    """Evaluation (deterministic) and training forwards of one model differ exactly when the temperature
    adapts at evaluation only (dropout 0, so nothing else differs)."""
    from cli_helpers import compose_train, tiny_task

    from attnlab.config.assembly import assemble

    cfg = compose_train(
        "model=tiny", "task=mqar", f"normalizer.adaptive_temperature={mode}", "normalizer.beta=0.1", *tiny_task("mqar")
    )
    task, (net,), _, _ = assemble(cfg, "softmax_ce")
    split = task.splits["test"]
    evaluated = np.asarray(net.body(split.inputs[:8], split.valid[:8])[0])
    trained = np.asarray(net.body(split.inputs[:8], split.valid[:8], deterministic=False, rngs=nnx.Rngs(dropout=0))[0])
    assert (np.abs(evaluated - trained).max() > 1e-4) == differs


def test_adaptive_temperature_gradient_matches_finite_differences_of_the_reference():
    """Training through it (mode train): d(Σ c·w)/dz, β' differentiated too (no stop-gradient, as in the paper)."""
    T, S, mask, m = R.make_mask("pad")
    q, k, _ = R.qkv(48, T, S)
    norm = R.build("softmax", {"adaptive_temperature": "train", "beta": 0.8})
    z = R.scores(q, k).astype(np.float32)
    c = np.random.default_rng(49).normal(size=z.shape)
    m_B1TS = mask.matrix_B1TS(T, S)
    gz = np.asarray(jax.grad(lambda z: jnp.sum(norm.inner.tempered(z, m_B1TS)[0] * c))(jnp.asarray(z)))
    for b, n, t in [(0, 0, 2), (1, 2, 5)]:
        idx = np.flatnonzero(m[b, t])

        def row_loss(r, b=b, n=n, t=t, idx=idx):
            x = 0.8 * r
            return float(R.softmax_np(R.adaptive_beta_np(x) * x) @ c[b, n, t, idx])

        assert R.adaptive_beta_np(0.8 * z[b, n, t, idx].astype(np.float64)) > 1  # the polynomial branch
        np.testing.assert_allclose(gz[b, n, t, idx], finite_difference(row_loss, z[b, n, t, idx]), rtol=1e-3, atol=1e-4)
        assert (gz[b, n, t, ~m[b, t]] == 0).all()


def test_stickbreaking_at_length_goes_blockwise_with_statistics_on_sampled_rows(monkeypatch):
    """impl=auto over the memory budget: the blockwise output equals the dense one, and the leftover mass
    is the reference's on the sampled rows (positions passed, so each row leaves out its own key)."""
    from attnlab.backends import sampled_rows
    from attnlab.normalizers import base

    monkeypatch.setattr(base, "memory_budget", lambda platform: 0)  # auto: every dense score over the budget
    monkeypatch.setattr(sampled_rows, "STATS_ROWS", 5)
    T = 24
    q, k, v = R.qkv(50, T, T)
    norm = R.build("stickbreaking", {"block_size": 8})
    assert norm.backend(T, T, R.nz.Mask(causal=True), jnp.float32).name == "blockwise"
    out, stats = norm(q, k, v, R.nz.Mask(causal=True), with_stats=True)
    dense = R.build("stickbreaking", {"impl": "dense"})
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(dense(q, k, v, R.nz.Mask(causal=True))[0]), rtol=2e-5, atol=2e-6
    )
    rows = sampled_rows.stats_rows(T, 5)
    m = R.admissible(R.B, T, T, causal=True)
    w = R.reference(dense, q, k, m)[0][:, :, rows]
    np.testing.assert_allclose(np.asarray(stats["leftover"]), (1 - w.sum(-1)).mean((0, 2)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name,opts,said",
    [
        ("ssmax", {"s": float("nan")}, "normalizer.s=nan"),
        ("ssmax", {"bias": 1}, "normalizer.bias=1"),
        ("ssmax", {"beta": 0.0}, "normalizer.beta=0.0"),
        ("softmax", {"adaptive_temperature": True}, "normalizer.adaptive_temperature=True"),
        ("kl", {"adaptive_temperature": "sometimes"}, "normalizer.adaptive_temperature='sometimes'"),
        ("stickbreaking", {"attend_current": "yes"}, "normalizer.attend_current='yes'"),
        ("stickbreaking", {"impl": "cudnn"}, "normalizer.impl='cudnn'"),
    ],
)
def test_bad_options_are_refused_naming_the_option_and_what_is_allowed(name, opts, said):
    from attnlab.checks import ConfigError

    with pytest.raises(ConfigError, match=rf"^{re.escape(said)} is invalid; allowed: "):
        R.config.normalizer(name, num_heads=2, head_dim=4, **opts)
