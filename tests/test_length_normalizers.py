"""The normalizers proposed against softmax's dispersion at length: closed forms from their papers, parameters
away from their initial values against the float64 references, and gradients against finite differences."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import normalizer_refs as R

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
    norm = R.nz.build(name, num_heads=1, head_dim=4, beta=1.0, **opts)
    z, m = spike_row(n, pad)
    w = np.asarray(norm.normalize(z, m)[0])
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
        w_ref, _, extras = R.ref_ssmax(q, k, m, norm, **R.options("ssmax", bias=True, s=s, b=b))
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

        np.testing.assert_allclose(np.asarray(gz)[bb, n, t], finite_difference(row_loss, z[bb, n, t]),
                                   rtol=1e-3, atol=1e-4)


def test_stickbreaking_closed_form_on_equal_scores():
    """Equal scores x on a causal row: key j (i−1−j keys more recent, the query's own left out) gets
    σ(x)(1 − σ(x))^{i−1−j}, the most recent the most, and (1 − σ(x))^{i} is left over (Tan et al. 2024)."""
    T, x = 9, 0.7
    q = jnp.ones((1, 1, T, 4)) * (x / 2)  # β·q·k = 0.5 · 4 · x/2 = x
    k = jnp.ones((1, 1, T, 4))
    norm = R.nz.build("stickbreaking", num_heads=1, head_dim=4, beta=0.5)
    w = np.asarray(norm.weights(q, k, R.nz.Mask(causal=True)))[0, 0]
    sig = 1 / (1 + math.exp(-x))
    expected = np.array([[sig * (1 - sig) ** (i - 1 - j) if j < i else 0.0 for j in range(T)] for i in range(T)])
    np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-7)
    _, stats = norm(q, k, k, R.nz.Mask(causal=True), with_stats=True)
    leftover = np.mean([(1 - sig) ** i for i in range(T)])  # row 0 has no key: the whole stick is left
    np.testing.assert_allclose(float(stats["leftover"][0]), leftover, rtol=1e-5)
    with_current = R.nz.build("stickbreaking", num_heads=1, head_dim=4, beta=0.5, attend_current=True)
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

        np.testing.assert_allclose(np.asarray(gz)[bb, n, t], finite_difference(row_loss, z[bb, n, t]),
                                   rtol=1e-3, atol=1e-4)


@pytest.mark.slow  # ~50 s on 2 cores: a subprocess run of two layers
def test_ssmax_and_stickbreaking_train_without_positions_and_log_their_statistics(tmp_path):
    """The README's example through the real entry point: a hybrid (layer 0 ssmax, layer 1 stick-breaking)
    with model.positional=none; s, the effective β and the leftover mass reach TensorBoard per layer and head."""
    from cli_helpers import TINY, TINY_TASK, events, metrics, run_cli

    run_dir = tmp_path / "out"
    run_cli(*TINY, *TINY_TASK["mqar"], "model.layers=2", "model.layer_normalizers=[ssmax,stickbreaking]",
            "normalizer=ssmax", "normalizer.bias=true", "model.positional=none", f"hydra.run.dir={run_dir}",
            cwd=tmp_path)
    assert metrics(run_dir)["status"] == "completed"
    tags = events(run_dir).Tags()
    for tag in ("attn_s/layer_0/head_1", "attn_bias/layer_0/head_0", "attn_beta/layer_0/head_0",
                "attn_leftover/layer_1/head_1", "attn_beta/layer_1/head_0"):
        assert tag in tags["scalars"], tag
    assert "attn_leftover/layer_0" not in tags["scalars"] and "attn_s/layer_1" not in tags["scalars"]
    leftover = [e.value for e in events(run_dir).Scalars("attn_leftover/layer_1")]
    assert leftover and all(0 < v <= 1 for v in leftover)
    assert "hist/beta" in tags["histograms"]


def test_stickbreaking_is_refused_for_bidirectional_models_naming_the_task():
    from cli_helpers import TINY_TASK
    from test_configs import compose_train

    from attnlab import cli
    from attnlab.checks import ConfigError

    def build(*overrides):
        return cli.build(compose_train("model=tiny", "task=listops", *overrides, *TINY_TASK["listops"]), "softmax_ce")

    with pytest.raises(ConfigError) as err:
        build("normalizer=stickbreaking")
    message = str(err.value)
    assert "\n" not in message and message.startswith("normalizer=stickbreaking needs causal attention, but "
                                                      "task=ListOps is a per-sequence task"), message
    assert "model.causal=null; allowed: a per-token task" in message, message
    with pytest.raises(ConfigError, match="normalizer=stickbreaking needs causal"):  # one layer of a hybrid
        build("model.layers=2", "model.layer_normalizers=[softmax,stickbreaking]")
    _, nets, _, _ = build("normalizer=stickbreaking", "model.causal=true")  # a causal per-sequence model is allowed
    assert nets[0].body.causal
