"""The statistics schema (statistics/__init__.py): both row forms against float64 row quantities, and every
declared statistic reaching its TensorBoard tags, description, chart and the final metrics' list."""

import jax.numpy as jnp
import normalizer_refs as R
import numpy as np
import pytest

from attnlab import statistics
from attnlab.board import summaries
from attnlab.statistics import final as final_statistics
from attnlab.train import evaluation


@pytest.mark.parametrize("kind", R.MASK_KINDS)
def test_weight_rows_and_softmax_rows_give_the_float64_row_quantities(kind):
    """Mass, entropy (nats), largest weight and the weight at each row's first admissible key, row by row in
    float64, against WeightRows of those weights and SoftmaxRows of their logits (rows with no key: 0)."""
    T, S, _, _, _ = R.mask_arrays(kind)
    m_BTS = R.make_mask(kind)[3]
    x_BNTS = 3.0 * np.random.default_rng(2).normal(size=(R.B, R.N, T, S))
    w_BNTS = R.rowwise(lambda r, *_: R.softmax_np(r), x_BNTS, m_BTS)
    want = {name: np.zeros((R.B, R.N, T)) for name in ("mass", "entropy", "max_weight", "first")}
    for b, n, t in np.ndindex(R.B, R.N, T):
        idx = np.flatnonzero(m_BTS[b, t])
        if idx.size:
            p = w_BNTS[b, n, t, idx]
            want["mass"][b, n, t], want["max_weight"][b, n, t] = p.sum(), p.max()
            want["entropy"][b, n, t] = -(p * np.log(p)).sum()
            want["first"][b, n, t] = p[0]
    m_B1TS = jnp.asarray(m_BTS[:, None])
    x = jnp.asarray(x_BNTS, jnp.float32)
    for rows in (
        statistics.WeightRows(jnp.asarray(w_BNTS, jnp.float32), x, m_B1TS),
        statistics.SoftmaxRows(x, x, m_B1TS),
    ):
        got = {
            "mass": rows.mass_BNR,
            "entropy": rows.entropy_BNR,
            "max_weight": rows.max_weight_BNR,
            "first": rows.weight_at(rows.first_key_B1R),
        }
        for name, value in got.items():
            np.testing.assert_allclose(value, want[name], atol=1e-5, err_msg=f"{type(rows).__name__}: {name}")


def test_core_stats_and_softmax_stats_report_every_statistic_computed_from_rows():
    """No statistic with a row form is dropped by either form (the sampled-row path included)."""
    m_B1TS = jnp.ones((1, 1, 4, 4), bool)
    x = jnp.zeros((1, 2, 4, 4))
    assert set(statistics.core_stats(x, x, m_B1TS)) == set(statistics.CORE_STATS)
    assert set(statistics.softmax_stats(x, x, m_B1TS)) == set(statistics.CORE_STATS)
    assert {"entropy", "max_weight", "row_mass", "max_logit"} <= set(statistics.CORE_STATS)


@pytest.mark.parametrize("stat", statistics.STATISTICS, ids=lambda s: s.name)
def test_each_declared_statistic_reaches_its_tags_description_chart_and_the_final_metrics(stat):
    """A train step's (L, N) values become attn_<name>/layer_i[/head_h] tags carrying the declared description;
    a chart is in every layer's custom-scalars category; `final` ones are evaluated at each test length."""
    metrics = {"loss": 0.0, "nonfinite": 0, "grad_norm": np.zeros(0), "attn": {stat.name: np.full((2, 3), 0.5)}}
    tags = summaries.flatten_train_metrics(metrics, has_beta=False)
    assert {f"attn_{stat.name}/layer_1", f"attn_{stat.name}/layer_1/head_2"} <= set(tags)
    assert summaries.description(f"attn_{stat.name}/layer_1/head_2") == stat.description != ""
    layout, plain = summaries.custom_scalars_layout(2, extreme=True), summaries.custom_scalars_layout(2)
    assert (stat.chart in layout["layer 1"]) == (stat.chart is not None)
    assert (stat.chart in plain["layer 1"]) == (
        stat.chart is not None and not stat.extreme
    )  # model.extreme_token_stats
    assert (stat in final_statistics.FINAL) == (stat.final is not None)
    assert (stat.name in evaluation.HISTOGRAMS) == stat.histogram


def test_every_statistic_and_derived_rate_declares_a_direction_none_by_default():
    """directions() (metrics.json's `directions`, read by attnlab-report) has attn_<name> for every statistic and
    the sink rates; each built-in statistic describes (None); a direction is higher, lower or None."""
    dirs = statistics.directions()
    assert set(dirs) == {f"attn_{s.name}" for s in statistics.STATISTICS} | {"attn_sink_rate", "attn_dormant_sink_rate"}
    assert all(d is None for d in dirs.values())
    assert statistics.Statistic("x", "a test", None, direction="higher").direction == "higher"
    with pytest.raises(ValueError, match="direction='up'"):
        statistics.Statistic("x", "a test", None, direction="up")
