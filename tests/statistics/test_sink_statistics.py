"""The attention-sink statistics: first-key and own-position weight (statistics.py) against float64 references on
hand-built weights with a known sink, the sink rate (Gu et al. 2024) where train steps and final metrics write it,
and the residual stream's outlier ratio and kurtosis (Sun et al. 2024; Zuhri et al. 2025) on a planted outlier."""

import jax.numpy as jnp
import numpy as np
import pytest

from attnlab import statistics
from attnlab.board import summaries
from attnlab.normalizers import reference as ref
from attnlab.statistics import final as final_statistics
from attnlab.statistics.residual import drain_and_peak, residual_outliers

B, N, T = 2, 3, 6
SINK, SELF = 0.6, 0.9  # head 0 parks SINK on the first admissible key, head 1 SELF on its own position


def sink_weights(m_BTS, q_pos_T):
    """(B,N,T,S) rows over the admissible keys: head 0 a sink, head 1 self-attending, head 2 uniform."""
    w = np.zeros((B, N) + m_BTS.shape[1:])
    for b, t in np.ndindex(B, len(q_pos_T)):
        idx = np.flatnonzero(m_BTS[b, t])
        if not idx.size:
            continue
        for n in range(N):
            w[b, n, t, idx] = 1.0 / idx.size
        if idx.size > 1:
            w[b, 0, t, idx] = (1 - SINK) / (idx.size - 1)
            w[b, 0, t, idx[0]] = SINK
            if q_pos_T[t] in idx:
                w[b, 1, t, idx] = (1 - SELF) / (idx.size - 1)
                w[b, 1, t, q_pos_T[t]] = SELF
    return w


def causal_window_padded(S, window=None):
    m = ref.admissible(B, S, S, key_valid_BS=np.arange(S)[None] < np.array([[S], [S - 2]]), causal=True, window=window)
    return m


@pytest.mark.parametrize("window", [None, 3])
def test_first_and_own_weight_of_a_known_sink_against_float64(window):
    """A window moves the first admissible key off position 0; padded rows (no key) are left out of the means."""
    m_BTS = causal_window_padded(T, window)
    w = sink_weights(m_BTS, np.arange(T))
    want = ref.core_stats(w, w, m_BTS)
    got = statistics.core_stats(jnp.asarray(w, jnp.float32), jnp.asarray(w, jnp.float32), jnp.asarray(m_BTS[:, None]))
    for name in ("first_weight", "self_weight"):
        np.testing.assert_allclose(got[name], want[name], atol=1e-6, err_msg=name)
    # By hand: row 0 has one key (its own, also its first), weight 1; every other row of head 0 puts SINK first,
    # of head 1 SELF on its own position where the row may see it (not the padded rows of example 1).
    n_BT, own_BT = m_BTS.sum(-1), m_BTS[:, np.arange(T), np.arange(T)]
    rows, one = (n_BT > 0).sum(), (n_BT == 1).sum()
    own, own_one = own_BT.sum(), (own_BT & (n_BT == 1)).sum()
    assert own == rows - 2 and one >= B
    assert want["first_weight"][0] == pytest.approx((SINK * (rows - one) + one) / rows)
    assert want["self_weight"][1] == pytest.approx((SELF * (own - own_one) + own_one) / own)
    assert want["first_weight"][0] > 0.3  # a sink head at Gu et al.'s ε
    np.testing.assert_allclose(
        statistics.sink_rate(want["first_weight"][None]), ref.sink_rate(want["first_weight"][None])
    )


def test_sampled_rows_use_their_own_query_positions():
    """Rows sampled from a longer sequence (q_pos_T) read their own position there, not the last R keys."""
    S, rows_R = 8, np.array([0, 3, 5])
    m_full = causal_window_padded(S)
    m_BRS = m_full[:, rows_R]
    w = sink_weights(m_BRS, rows_R)
    want = ref.core_stats(w, w, m_BRS, q_pos_T=rows_R)
    for rows in (
        statistics.WeightRows(jnp.asarray(w, jnp.float32), jnp.asarray(w), jnp.asarray(m_BRS[:, None]), rows_R),
        statistics.SoftmaxRows(
            jnp.asarray(np.log(np.where(w > 0, w, 1e-30)), jnp.float32),
            jnp.asarray(w),
            jnp.asarray(m_BRS[:, None]),
            rows_R,
        ),
    ):
        got = statistics.per_head(rows)
        for name in ("first_weight", "self_weight"):
            np.testing.assert_allclose(got[name], want[name], atol=1e-5, err_msg=f"{type(rows).__name__} {name}")
    assert want["self_weight"][1] > 0.85  # the defaulted positions (last 3 of 8) would miss the diagonal


def test_sink_rate_in_train_tags_and_final_metrics_equals_the_float64_share():
    """attn_sink_rate/layer_i and attn_sink_rate from per-head first-key weights, in both places they are written."""
    first_LN = np.array([[0.9, 0.31, 0.1, 0.29], [0.05, 0.2, 0.1, 0.3], [0.5, 0.6, 0.7, 0.8]])
    want_L = ref.sink_rate(first_LN)
    np.testing.assert_allclose(want_L, [0.5, 0.0, 1.0])
    tags = summaries.flatten_train_metrics(
        {"loss": 0.0, "nonfinite": 0, "grad_norm": np.zeros(0), "attn": {"first_weight": first_LN}}, has_beta=False
    )
    examples = 4.0
    attn = {s: jnp.asarray(first_LN * examples) for s in (s.name for s in final_statistics.FINAL if s.of_maps is None)}
    final = final_statistics.means({**attn, "examples": jnp.float32(examples)})
    for out in (tags, final):
        for i, r in enumerate(want_L):
            assert float(out[f"attn_sink_rate/layer_{i}"]) == pytest.approx(r)
        assert float(out["attn_sink_rate"]) == pytest.approx(want_L.mean())
    assert float(final["attn_first_weight/layer_2/head_1"]) == pytest.approx(0.6)
    assert [tags[f"attn_sink_rate/layer_0/head_{h}"] for h in range(4)] == [1.0, 1.0, 0.0, 0.0]  # a sink head: 1


def test_residual_outliers_of_a_planted_outlier_against_float64():
    """Largest |x| over median |x| and the kurtosis over the valid tokens only: a larger value on a padded token
    is ignored."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 7, 16))
    x[0, 0, 3] = 400.0  # the massive activation, on the first token
    x[1, 6, 0] = 1e4  # on padding
    valid = np.arange(7)[None] < np.array([[7], [5]])
    want_ratio, want_kurt = ref.residual_outliers(x, valid)
    ratio, kurt = residual_outliers(jnp.asarray(x, jnp.float32), jnp.asarray(valid))
    assert float(ratio) == pytest.approx(want_ratio, rel=1e-5)
    assert float(kurt) == pytest.approx(want_kurt, rel=1e-4)
    assert want_ratio > 400 and want_kurt > 50  # the outlier dominates; a Gaussian alone gives ~3
    g = rng.normal(size=(4, 64, 64))
    assert float(residual_outliers(jnp.asarray(g), jnp.ones((4, 64), bool))[1]) == pytest.approx(3.0, abs=0.1)


def test_value_drain_and_residual_peak_of_a_planted_first_token_against_float64():
    """The first token's norm over the median of the other valid tokens' norms, mean over the examples with two or
    more valid tokens: by hand in float64, a padded token's norm ignored."""
    rng = np.random.default_rng(1)
    v_BNTH = rng.normal(size=(3, 2, 7, 4))
    v_BNTH[:, 0, 0] *= 0.01  # head 0: a drained first value
    v_BNTH[1, :, 6] = 1e3  # on padding
    valid_BT = np.arange(7)[None] < np.array([[7], [5], [1]])  # the third example has no other token
    want_N = np.zeros(2)
    for n in range(2):
        ratios = []
        for b in range(2):  # example 2 has one valid token: left out
            norms = np.linalg.norm(v_BNTH[b, n], axis=-1)
            ratios.append(norms[0] / np.median(norms[1 : valid_BT[b].sum()]))
        want_N[n] = np.mean(ratios)
    x_BTD = v_BNTH[:, 1] * 3.0  # a residual stream: its peak is head 1's ratio
    layers = [(v_BNTH, x_BTD), (v_BNTH[:, ::-1], x_BTD * 0 + v_BNTH[:, 0])]
    value_LBNT = jnp.asarray(np.stack([np.linalg.norm(v, axis=-1) for v, _ in layers]), jnp.float32)
    residual_LBT = jnp.asarray(np.stack([np.linalg.norm(x, axis=-1) for _, x in layers]), jnp.float32)
    got = drain_and_peak(value_LBNT, residual_LBT, jnp.asarray(valid_BT))
    np.testing.assert_allclose(np.asarray(got["value_drain"]), [want_N, want_N[::-1]], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got["residual_peak"]), [[want_N[1]] * 2, [want_N[0]] * 2], rtol=1e-5)
    assert want_N[0] < 0.05 < 0.5 < want_N[1]  # the planted drain, and none in head 1


def test_dormant_first_weight_against_float64_and_its_sink_rate():
    """The first-key weight over each example's dormant rows that see two or more keys, by hand; examples without
    such rows are left out of the batch mean; the dormant sink rate counts the heads above ε."""
    rng = np.random.default_rng(2)
    L, Bn, Nh, Tn = 2, 3, 2, 5
    maps = rng.dirichlet(np.ones(Tn), size=(L, Bn, Nh, Tn))
    rows = rng.random((Bn, Tn)) < 0.6
    rows[2] = [True, False, False, False, False]  # only row 0, which sees one key: no dormant row
    got = np.asarray(statistics.dormant_first_weight(jnp.asarray(maps, jnp.float32), jnp.asarray(rows)))
    for layer, b, n in np.ndindex(L, Bn, Nh):
        picked = [maps[layer, b, n, t, 0] for t in range(1, Tn) if rows[b, t]]
        want = np.mean(picked) if picked else np.nan
        np.testing.assert_allclose(got[layer, b, n], want, rtol=1e-5, err_msg=str((layer, b, n)))
    attn = {stat: np.full((L, Nh), 0.2) for stat in (s.name for s in final_statistics.FINAL if s.of_maps is None)}
    attn.update(dormant_first_weight=np.array([[0.8, 0.1], [0.1, 0.1]]), examples=np.float32(2.0))
    out = final_statistics.means({k: jnp.asarray(v) for k, v in attn.items()})
    assert float(out["attn_dormant_first_weight/layer_0/head_0"]) == pytest.approx(0.4)
    assert [float(out[f"attn_dormant_sink_rate/layer_{i}"]) for i in range(2)] == [0.5, 0.0]
    assert float(out["attn_dormant_sink_rate"]) == pytest.approx(0.25)


def test_without_final_stats_the_test_split_runs_the_val_program(tmp_path):
    """trainer.final_stats=false (the default): no attention statistic in the final metrics, and the test split is
    evaluated by the very program the val split is (one compile)."""
    from cli_helpers import TINY, metrics, tiny_task, train_in_process

    run_dir = tmp_path / "r"
    train_in_process(*TINY, *tiny_task("mqar"), f"hydra.run.dir={run_dir}", cwd=tmp_path)
    final = metrics(run_dir)["final"]
    assert "test/accuracy" in final and not any("attn_" in k for k in final)


def test_a_tiny_softpick_lm_run_reports_the_sink_statistics_everywhere(tmp_path):
    """metrics.json (test split and each test length), TensorBoard (train steps and the final test scalars) and
    attnlab-report's metrics all carry them; the sink rate agrees with the per-head first-key weights written."""
    from cli_helpers import TINY, events, metrics, tiny_task, train_in_process

    from attnlab.report import cli as report_cli

    run_dir = tmp_path / "r"
    overrides = (*TINY, *tiny_task("lm"), "normalizer=softpick", "model.layers=2", "task.test_lengths=[32]")
    overrides = (*overrides, "trainer.final_stats=true", "model.extreme_token_stats=true")
    train_in_process(*overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    final = metrics(run_dir)["final"]
    stats = ("first_weight", "self_weight", "massive_ratio", "kurtosis", "row_mass", "value_drain", "residual_peak")
    stats = (*stats, "sink_rate")
    for prefix in ("test/", "test_len/32/"):
        for stat in (*stats[:-1], "dormant_first_weight", "dormant_sink_rate"):
            for i in range(2):
                assert np.isfinite(final[f"{prefix}attn_{stat}/layer_{i}"]), (prefix, stat, i)
        heads_LN = np.array(
            [[final[f"{prefix}attn_first_weight/layer_{i}/head_{h}"] for h in range(2)] for i in range(2)]
        )
        np.testing.assert_allclose(
            [final[f"{prefix}attn_sink_rate/layer_{i}"] for i in range(2)], ref.sink_rate(heads_LN)
        )
        assert final[f"{prefix}attn_sink_rate"] == pytest.approx(ref.sink_rate(heads_LN).mean())
        assert final[f"{prefix}attn_kurtosis/layer_0"] > 1.0  # Pearson's kurtosis is ≥ 1 for any distribution
    scalars = set(events(run_dir).Tags()["scalars"])
    for stat in stats:
        assert f"attn_{stat}/layer_1" in scalars, stat  # train logging steps: the curves over training
    assert {"attn_sink_rate", "attn_first_weight/layer_0/head_1", "test/attn_sink_rate"} <= scalars
    assert {"test/attn_kurtosis/layer_1", "test_len/32/attn_massive_ratio/layer_0"} <= scalars
    out = tmp_path / "report"
    metric_names = ["test/attn_sink_rate", "test/attn_first_weight/layer_0", "test/attn_kurtosis/layer_1"]
    assert report_cli.cli([str(run_dir), "--metrics", *metric_names, "--out", str(out)]) in (0, None)
    csv = (out / "report.csv").read_text()
    for name in metric_names:
        assert f"{name}," in csv
    row = next(line for line in csv.splitlines() if line.startswith("test/attn_sink_rate,"))
    assert float(row.split(",")[3]) == pytest.approx(final["test/attn_sink_rate"])
    # the run recorded each statistic's direction (none: they describe), and the report says so
    assert metrics(run_dir)["directions"] == statistics.directions()
    md = (out / "report.md").read_text()
    for name in metric_names:
        assert f"- **{name}** (no better direction; highest first)" in md, name
    assert "is better" not in md


def test_bigram_backcopy_turns_on_the_sink_statistics_it_exists_to_measure(tmp_path):
    """task=bigram_backcopy (Task.measures_sinks) with trainer.final_stats and model.extreme_token_stats left null:
    the final metrics hold the dormant rows' first-key weight and the residual stream's statistics."""
    from cli_helpers import TINY, metrics, tiny_task, train_in_process

    run_dir = tmp_path / "r"
    overrides = (*TINY, *tiny_task("bigram_backcopy"), "task=bigram_backcopy", "normalizer=softmax")
    train_in_process(*overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    final = metrics(run_dir)["final"]
    for stat in ("dormant_first_weight", "first_weight", "value_drain", "residual_peak"):
        assert 0.0 <= final[f"test/attn_{stat}/layer_0"] < float("inf"), stat
    assert 0.0 < final["test/attn_dormant_first_weight/layer_0/head_0"] < 1.0


@pytest.mark.parametrize(
    "task_class, given, want",
    [
        ("BigramBackcopy", None, True),
        ("BigramBackcopy", False, False),
        ("MQAR", None, False),
        ("MQAR", True, True),
    ],
)
def test_a_null_switch_follows_the_task_and_a_given_one_stays(task_class, given, want):
    from attnlab import tasks
    from attnlab.config.assembly import sink_statistics

    nodes = {"trainer": {"final_stats": given, "steps": 4}, "model": {"extreme_token_stats": given, "d_model": 8}}
    out = sink_statistics(getattr(tasks, task_class), nodes)
    assert out["trainer"] == {"final_stats": want, "steps": 4} and out["model"] == {
        "extreme_token_stats": want,
        "d_model": 8,
    }
