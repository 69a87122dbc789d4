"""Heads: losses against float64 hand computations, HL-Gauss targets, calibration, registry."""

import calibration_ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
import scipy.stats
from flax import nnx

from attnlab import config, heads
from attnlab.config import registry
from attnlab.heads import calibration as cal
from attnlab.train import evaluation

D, C = 6, 5
LEADING = [(3, 5), (7,)]


def _num_classes(name):
    return C if config.head_kind(name) == "classification" else None


def _weights(rng, shape):
    """Positive weights (summing to more than 1) with some zeros."""
    w = rng.uniform(0.5, 2.0, shape)
    w.flat[::3] = 0.0
    return w


def _targets(rng, name, shape):
    if config.head_kind(name) == "classification":
        return rng.integers(0, C, shape)
    return rng.uniform(-6.0, 6.0, shape)


def _build(name, **options):
    return config.head(name, d_model=D, num_classes=_num_classes(name), rngs=nnx.Rngs(0), **options)


def _np_wmean(loss, w):
    return (w * loss).sum() / max(w.sum(), 1.0)


def _np_hl_gauss(y, edges, sigma):
    cdf = scipy.stats.norm.cdf(edges, loc=np.asarray(y, np.float64)[..., None], scale=sigma)
    return (cdf[..., 1:] - cdf[..., :-1]) / (cdf[..., -1:] - cdf[..., :1])


def _scores_mse(head, out, y):
    onehot = np.eye(C)[y]
    return (head.k * ((out - head.M) ** 2 * onehot).sum(-1) + (out**2 * (1 - onehot)).sum(-1)) / C


def _hl_gauss_ce(head, out, y):
    p = _np_hl_gauss(y, np.linspace(head.v_min, head.v_max, head.num_bins + 1), head.sigma)
    return -(p * scipy.special.log_softmax(out, -1)).sum(-1)


# Per-position loss of each head in float64 numpy, from the formulas of the papers: every registered head needs one.
HAND_LOSSES = {
    "softmax_ce": lambda head, out, y: (
        -np.take_along_axis(scipy.special.log_softmax(out, -1), y[..., None], -1)[..., 0]
    ),
    "scores_mse": _scores_mse,
    "mse": lambda head, out, y: (out - y) ** 2,
    "hlgauss": _hl_gauss_ce,
}
# Option variants per head; a head missing here runs with its YAML defaults.
VARIANTS = {"scores_mse": [{}, {"k": 3.0, "M": 2.5}]}
CASES = [(name, options) for name in registry.choices("head") for options in VARIANTS.get(name, [{}])]


def _hand_loss(name, head, out, y, w):
    """The weighted mean of the head's float64 per-position loss."""
    if name not in HAND_LOSSES:
        pytest.fail(f"head {name!r} has no float64 reference in tests/heads/test_heads.py HAND_LOSSES")
    return _np_wmean(HAND_LOSSES[name](head, np.asarray(out, np.float64), y), w)


def test_every_registered_head_has_a_float64_reference():
    missing = sorted(set(registry.choices("head")) - set(HAND_LOSSES))
    assert not missing, f"add float64 references (tests/heads/test_heads.py HAND_LOSSES) for {missing}"


@pytest.mark.parametrize("shape", LEADING)
@pytest.mark.parametrize("name,options", CASES)
def test_loss_matches_hand_computation_and_ignores_zero_weights(name, options, shape):
    rng = np.random.default_rng(0)
    head = _build(name, **options)
    out = head(jnp.asarray(rng.normal(size=shape + (D,)) * 3, jnp.float32))
    y, w = _targets(rng, name, shape), _weights(rng, shape)
    loss = head.loss(out, y, w)
    assert loss.shape == ()
    np.testing.assert_allclose(float(loss), _hand_loss(name, head, out, y, w), rtol=2e-5)
    # targets of weight-0 positions are never read, even garbage ones
    y2 = y.copy()
    if config.head_kind(name) == "classification":
        y2[w == 0] = np.where(rng.random((w == 0).sum()) < 0.5, -1, (y2[w == 0] + 1) % C)
    else:
        y2[w == 0] = np.where(rng.random((w == 0).sum()) < 0.5, np.nan, 1e6)
    assert float(head.loss(out, y2, w)) == float(loss)
    metrics, metrics2 = head.metrics(out, y, w), head.metrics(out, y2, w)
    for key in metrics:
        np.testing.assert_allclose(float(metrics2[key]), float(metrics[key]), err_msg=key)
    grads = nnx.grad(lambda h: h.loss(h(jnp.ones(shape + (D,))), y2, w))(head)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))


def test_hl_gauss_target_matches_normal_cdf_sums_to_one_and_decodes_y():
    head = _build("hlgauss")
    edges = np.linspace(head.v_min, head.v_max, head.num_bins + 1)
    width = edges[1] - edges[0]
    assert head.sigma == pytest.approx(0.75 * width)
    y = np.linspace(head.v_min + 3 * head.sigma, head.v_max - 3 * head.sigma, 401)
    p = np.asarray(heads.hl_gauss_target(y, jnp.asarray(edges), head.sigma), np.float64)
    np.testing.assert_allclose(p, _np_hl_gauss(y, edges, head.sigma), atol=2e-6)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    centres = (edges[:-1] + edges[1:]) / 2
    assert np.abs(p @ centres - y).max() < width / 2
    # the head decodes its own target back to y: centres are the unshifted midpoints
    decoded = np.asarray(head.predict(jnp.log(jnp.asarray(p, jnp.float32) + 1e-30)))
    assert np.abs(decoded - y).max() < 0.1 * width
    np.testing.assert_allclose(np.asarray(head.centres()), centres, atol=1e-5)


def test_hl_gauss_is_biased_without_margin():
    """Targets at the range ends decode inwards, which is why the YAML asks for a 3σ margin."""
    head = _build("hlgauss")
    p = head.target(jnp.asarray([head.v_min, head.v_max]))
    decoded = np.asarray(p @ head.centres())
    assert decoded[0] > head.v_min + head.sigma / 2 and decoded[1] < head.v_max - head.sigma / 2


def _loop_ece(probs, labels, weights, n_bins=15):
    conf, correct = probs.max(-1), (probs.argmax(-1) == labels).astype(float)
    total, bounds = 0.0, np.linspace(0, 1, n_bins + 1)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        m = (conf > lo) & (conf <= hi)
        if weights[m].sum() > 0:
            acc = (weights[m] * correct[m]).sum() / weights[m].sum()
            avg_conf = (weights[m] * conf[m]).sum() / weights[m].sum()
            total += weights[m].sum() / weights.sum() * abs(acc - avg_conf)
    return total


def _sample_labels(rng, probs):
    cum = probs.cumsum(-1)
    return np.minimum((rng.random(probs.shape[:-1])[..., None] > cum).sum(-1), probs.shape[-1] - 1)


def test_ece_calibrated_near_zero_overconfident_not_and_matches_loop():
    rng = np.random.default_rng(1)
    probs = scipy.special.softmax(rng.normal(size=(100_000, C)) * 1.5, -1)
    labels, w = _sample_labels(rng, probs), np.ones(100_000)
    sharp = probs**4 / (probs**4).sum(-1, keepdims=True)
    assert float(cal.ece(probs, labels, w)) < 0.01
    assert float(cal.ece(sharp, labels, w)) > 0.1
    w = _weights(rng, 100_000)
    for p in (probs, sharp):
        np.testing.assert_allclose(float(cal.ece(p, labels, w)), _loop_ece(p, labels, w), rtol=1e-9)
        # the jnp path (used inside head.metrics) is the same formula
        jax_ece = cal.ece(jnp.asarray(p, jnp.float32), jnp.asarray(labels), jnp.asarray(w, jnp.float32))
        np.testing.assert_allclose(float(jax_ece), _loop_ece(p, labels, w), atol=1e-4)


@pytest.mark.parametrize("t_true", [0.5, 2.5])
def test_temperature_scaling_recovers_known_temperature(t_true):
    rng = np.random.default_rng(2)
    z = rng.normal(size=(2, 40_000, 10)) * 3.0
    y = _sample_labels(rng, scipy.special.softmax(z / t_true, -1))
    w = np.ones(y.shape)
    t = float(cal.fit_temperature(z[0], y[0], w[0]))
    assert t == pytest.approx(t_true, rel=0.03)
    assert t == pytest.approx(calibration_ref.fit_temperature(z[0], y[0], w[0]), rel=2e-5)  # host float64 Brent fit
    # On the held-out half: the fitted T lowers the NLL and the ECE, and leaves the accuracy as it is.
    assert float(cal.nll(z[1] / t, y[1], w[1])) <= float(cal.nll(z[1], y[1], w[1]))
    ece_ts = _loop_ece(scipy.special.softmax(z[1] / t, -1), y[1], w[1])
    assert ece_ts < _loop_ece(scipy.special.softmax(z[1], -1), y[1], w[1]) and ece_ts < 0.02
    assert float(cal.accuracy(z[1] / t, y[1], w[1])) == float(cal.accuracy(z[1], y[1], w[1]))


def test_the_runs_temperature_fit_fits_each_seed_on_its_own_sample():
    """The final metrics' fit over stacked seeds (train.evaluation._fit) gives each seed its own float64 fit."""
    rng = np.random.default_rng(4)
    z = rng.normal(size=(2, 4_000, C)) * 3.0
    y = np.stack([_sample_labels(rng, scipy.special.softmax(z[s] / t, -1)) for s, t in enumerate((0.5, 2.0))])
    w = np.stack([_weights(rng, 4_000) for _ in range(2)])
    t_S = np.asarray(evaluation._fit(jnp.asarray(z, jnp.float32), jnp.asarray(y), jnp.asarray(w, jnp.float32)))
    want = [calibration_ref.fit_temperature(z[s], y[s], w[s]) for s in range(2)]
    np.testing.assert_allclose(t_S, want, rtol=2e-5)


def test_temperature_of_calibrated_logits_is_one_and_never_hurts():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(20_000, C))
    y = _sample_labels(rng, scipy.special.softmax(z, -1))
    w = _weights(rng, 20_000)
    t = float(cal.fit_temperature(z, y, w))
    assert t == pytest.approx(1.0, rel=0.05)
    assert t == pytest.approx(calibration_ref.fit_temperature(z, y, w), rel=1e-5)
    assert float(cal.nll(z / t, y, w)) <= float(cal.nll(z, y, w))


def test_calibration_sample_keeps_the_first_weighted_positions_up_to_the_cap():
    rng = np.random.default_rng(7)
    z, y, w = rng.normal(size=(6, 8, C)), rng.integers(0, C, (6, 8)), _weights(rng, (6, 8))
    keep = np.flatnonzero(w.reshape(-1) > 0)
    for cap, n in ((10, 10), (1000, 48)):  # below and above the 32 weighted positions
        zs, ys, ws, count = cal.calibration_sample(jnp.asarray(z), jnp.asarray(y), jnp.asarray(w), cap)
        used = keep[: min(cap, keep.size)]
        assert ws.shape == (n,) and int(count) == used.size
        np.testing.assert_allclose(np.asarray(zs)[: used.size], z.reshape(-1, C)[used], rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(ys)[: used.size], y.reshape(-1)[used])
        np.testing.assert_allclose(np.asarray(ws), np.pad(w.reshape(-1)[used], (0, n - used.size)), rtol=1e-6)


def test_regression_metrics_r2_and_mse_rel():
    rng = np.random.default_rng(4)
    y, w = rng.normal(size=(4, 9)) * 2 + 1, _weights(rng, (4, 9))
    pred = y + rng.normal(size=y.shape)
    head = _build("mse")
    m = head.metrics(jnp.asarray(pred), y, w, baseline_mse=3.0)
    mse = _np_wmean((pred - y) ** 2, w)
    ybar = (w * y).sum() / w.sum()
    r2 = 1 - (w * (y - pred) ** 2).sum() / (w * (y - ybar) ** 2).sum()
    got = [float(m["mse"]), float(m["r2"]), float(m["mse_rel"])]
    np.testing.assert_allclose(got, [mse, r2, mse / 3.0], rtol=1e-5)
    perfect = head.metrics(jnp.asarray(y), y, w)
    assert float(perfect["r2"]) == pytest.approx(1.0) and "mse_rel" not in perfect
    # hlgauss reports the same regression metrics on its decoded prediction, plus nll
    hl = _build("hlgauss")
    logits = jnp.asarray(rng.normal(size=(4, 9, hl.num_bins)), jnp.float32)
    m = hl.metrics(logits, y, w, baseline_mse=2.0)
    pred = np.asarray(hl.predict(logits), np.float64)
    np.testing.assert_allclose(float(m["mse"]), _np_wmean((pred - y) ** 2, w), rtol=1e-5)
    np.testing.assert_allclose(float(m["mse_rel"]), _np_wmean((pred - y) ** 2, w) / 2.0, rtol=1e-5)
    np.testing.assert_allclose(float(m["nll"]), float(hl.loss(logits, y, w)))


@pytest.mark.parametrize("name", ["softmax_ce", "scores_mse"])
def test_classification_metrics_match_numpy(name):
    rng = np.random.default_rng(5)
    out = rng.normal(size=(3, 50, C)) * 2
    y, w = rng.integers(0, C, (3, 50)), _weights(rng, (3, 50))
    m = jax.jit(_build(name).metrics)(jnp.asarray(out, jnp.float32), y, w)
    p = scipy.special.softmax(out, -1)
    onehot = np.eye(C)[y]
    np.testing.assert_allclose(float(m["accuracy"]), _np_wmean(out.argmax(-1) == y, w), rtol=1e-6)
    np.testing.assert_allclose(float(m["nll"]), _np_wmean(-np.log((p * onehot).sum(-1)), w), rtol=1e-5)
    np.testing.assert_allclose(float(m["brier"]), _np_wmean(((p - onehot) ** 2).sum(-1), w), rtol=1e-5)
    np.testing.assert_allclose(float(m["ece"]), _loop_ece(p.reshape(-1, C), y.ravel(), w.ravel()), atol=1e-5)


def test_kind_of_compatible_and_make_errors():
    assert config.head_kind("softmax_ce") == config.head_kind("scores_mse") == "classification"
    assert config.head_kind("mse") == config.head_kind("hlgauss") == "regression"
    assert config.heads_for("classification") == ["scores_mse", "softmax_ce"]
    assert config.heads_for("regression") == ["hlgauss", "mse"]
    with pytest.raises(ValueError, match="heads for classification: scores_mse, softmax_ce"):
        config.check_head_serves("mse", "classification", "mqar")
    config.check_head_serves("hlgauss", "regression")
    with pytest.raises(ValueError, match="hlgauss.*mse.*scores_mse.*softmax_ce"):
        config.head("nope", d_model=D, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="allowed: M, bias, ece_bins, k"):
        config.head("scores_mse", d_model=D, num_classes=C, rngs=nnx.Rngs(0), sigma_ratio=1.0)
    with pytest.raises(ValueError):
        config.head("softmax_ce", d_model=D, rngs=nnx.Rngs(0))  # classification without num_classes
    with pytest.raises(ValueError):
        config.head("mse", d_model=D, num_classes=C, rngs=nnx.Rngs(0))
