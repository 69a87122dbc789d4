"""task.test_lengths: test splits at lengths never trained on, their metrics in metrics.json and TensorBoard,
the refusals, and the report's length table."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_helpers import TINY, compose_train, events, metrics, tiny_task, train_in_process
from flax import nnx
from scipy import stats as sps

from attnlab import config
from attnlab.checks import ConfigError
from attnlab.config.assembly import assemble
from attnlab.tasks.base import Split

SMALL = dict(n_train=60, n_val=20, n_test=30)


def same_split(a: Split, b: Split) -> None:
    for name in ("inputs", "targets", "weights", "valid"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def mqar_labels(inputs, k):
    """(positions, values) of each query, read from the tokens alone: the key's partner in the context."""
    pos, vals = [], []
    for row in inputs:
        pairs = dict(zip(row[0 : 2 * k : 2].tolist(), row[1 : 2 * k : 2].tolist()))
        q = [t for t in range(2 * k, len(row)) if row[t] in pairs]
        pos.append(q)
        vals.append([pairs[row[t]] for t in q])
    return pos, vals


def test_mqar_at_a_longer_length_is_its_own_generator_there_with_the_same_pairs():
    opts = dict(seq_len=16, vocab_size=32, num_kv_pairs=3, seed=5, **SMALL)
    task = config.task("mqar", **opts, test_lengths=[48, 16])
    assert sorted(task.at_lengths) == [16, 48]
    same_split(task.at_lengths[16].splits["test"], task.splits["test"])  # the training length: the test split
    longer = task.at_lengths[48].splits["test"]
    same_split(longer, config.task("mqar", **{**opts, "seq_len": 48}).splits["test"])
    assert longer.inputs.shape == (30, 48)
    pos, vals = mqar_labels(longer.inputs, 3)
    for i in range(len(longer)):
        assert len(pos[i]) == 3 and np.flatnonzero(longer.weights[i]).tolist() == pos[i]
        assert longer.targets[i, pos[i]].tolist() == vals[i]
    assert max(max(p) for p in pos) >= 16  # queries lie beyond the training length


def context_pairs(row, vocab_size):
    """The leading key-value pairs of an MQAR row, read from the tokens: a key in [1, V/2), then a value in [V/2, V)."""
    half, n = vocab_size // 2, 0
    while 2 * n + 1 < len(row) and 1 <= row[2 * n] < half and half <= row[2 * n + 1] < vocab_size:
        n += 1
    return n


@pytest.mark.parametrize(
    ("test_pairs", "test_lengths", "want"),
    [("scale", [48, 16, 32], {16: 3, 32: 6, 48: 9}), ([5, 2], [40, 24], {40: 5, 24: 2}), ("same", [48], {48: 3})],
)
def test_mqar_test_pairs_sets_the_pairs_of_each_test_length(test_pairs, test_lengths, want):
    opts = dict(seq_len=16, vocab_size=64, num_kv_pairs=3, seed=4, **SMALL)
    task = config.task("mqar", **opts, test_lengths=test_lengths, test_pairs=test_pairs)
    assert sorted(task.at_lengths) == sorted(want)
    for length, pairs in want.items():
        split = task.at_lengths[length].splits["test"]
        assert split.inputs.shape == (30, length)
        pos, vals = mqar_labels(split.inputs, pairs)
        for i, row in enumerate(split.inputs):
            assert context_pairs(row, 64) == pairs
            assert len(pos[i]) == pairs and np.flatnonzero(split.weights[i]).tolist() == pos[i]
            assert split.targets[i, pos[i]].tolist() == vals[i]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(test_pairs="more", test_lengths=[32]), "task.test_pairs='more' is invalid; allowed: same, scale, or a"),
        (dict(test_pairs=[0], test_lengths=[32]), "task.test_pairs=[0] is invalid; allowed: same, scale, or a"),
        (dict(test_pairs=[4, 8], test_lengths=[32]), "has 2 counts for 1 task.test_lengths=[32]; allowed: same, scale"),
        (dict(test_pairs=[4]), "has 1 counts for 0 task.test_lengths=[]"),
        (dict(test_pairs="scale", test_lengths=[64]), "gives 12 pairs at task.seq_len=64; allowed: at most min("),
        (dict(test_pairs=[9], test_lengths=[32]), "gives 9 pairs at task.seq_len=32; allowed: at most min(seq_len/4"),
    ],
)
def test_mqar_impossible_test_pairs_are_refused_in_one_line(options, message):
    with pytest.raises(ConfigError) as err:
        config.task("mqar", seq_len=16, vocab_size=16, num_kv_pairs=3, **SMALL, **options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_icl_regression_has_more_points_of_one_linear_function_per_prompt():
    task = config.task("icl_regression", dim=3, n_points=5, seed=1, **SMALL, test_lengths=[12])
    split = task.at_lengths[12].splits["test"]
    assert split.inputs.shape == (30, 24, 4)
    xs, ys = split.inputs[:, 0::2, :3].astype(np.float64), split.inputs[:, 1::2, 3].astype(np.float64)
    for x, y in zip(xs, ys):  # noiseless: 12 points of one w, recovered by least squares from all of them
        w = np.linalg.lstsq(x, y, rcond=None)[0]
        np.testing.assert_allclose(x @ w, y, atol=1e-4)
    np.testing.assert_array_equal(split.targets[:, 0::2], split.inputs[:, 1::2, 3])


def test_lm_windows_are_longer_windows_of_the_test_text():
    task = config.task("lm", seq_len=16, n_train=20, n_val=8, n_test=8, test_lengths=[40])
    at = task.at_lengths[40]
    split, text = at.splits["test"], bytes(task.text["test"])
    assert split.inputs.shape == (8, 40)
    for x, y in zip(split.inputs, split.targets):
        np.testing.assert_array_equal(x[1:] - 1, y[:-1])  # each target is the next input byte
        assert bytes((x - 1).astype(np.uint8).tolist()) + bytes([int(y[-1])]) in text


@pytest.mark.parametrize("name", ["listops", "digits"])
def test_tasks_without_a_length_refuse_test_lengths(name):
    with pytest.raises(ConfigError) as err:
        config.task(name, test_lengths=[32])
    assert "task.test_lengths=[32] is not available" in str(err.value) and "\n" not in str(err.value)
    assert "allowed with mqar and lm (seq_len)" in str(err.value)


@pytest.mark.parametrize("value", [[0], [16, 16], "64", [8.5]])
def test_bad_test_lengths_are_refused(value):
    with pytest.raises(ConfigError, match="allowed: null or a list of distinct integers >= 1"):
        config.task("mqar", test_lengths=value)


def test_lengths_beyond_the_position_table_are_refused_naming_the_fix():
    cfg = compose_train("model=tiny", "model.max_len=100", "task.n_train=50", "task.test_lengths=[64,256]")
    with pytest.raises(ConfigError) as err:
        assemble(cfg, "softmax_ce")
    assert str(err.value) == (
        "task.test_lengths=[64, 256] needs sequences of 256 positions, beyond the "
        "model.positional=learned table of model.max_len=100; raise model.max_len to >= 256 "
        "or use model.positional=rope or none"
    )
    for fix in ("model.max_len=256", "model.positional=rope", "model.positional=none"):
        assemble(
            compose_train("model=tiny", "model.max_len=100", "task.n_train=50", "task.test_lengths=[64,256]", fix),
            "softmax_ce",
        )


def test_attention_statistics_per_length_are_example_weighted_and_skip_padding():
    """make_evaluate's attn_* at batches of 5 over 12 examples (3 padding rows) equal core_stats of one batch."""
    from attnlab.train.evaluation import make_evaluate
    from attnlab.train.trees import pad_split

    task = config.task("mqar", seq_len=16, vocab_size=16, num_kv_pairs=2, n_train=10, n_val=4, n_test=12)
    cfg = compose_train(
        "model=tiny",
        "model.layers=2",
        "task=mqar",
        "task.seq_len=16",
        "task.vocab_size=16",
        "task.num_kv_pairs=2",
        "task.n_train=10",
    )
    _, nets, _, _ = assemble(cfg, "softmax_ce")
    graphdef, params, rest = nnx.split(nets[0], nnx.Param, ...)
    split = pad_split(task.splits["test"], 5)
    assert len(split["inputs"]) == 15
    stack = lambda t: jax.tree.map(lambda x: x[None], t)  # noqa: E731
    got, _ = make_evaluate(graphdef, nets[0].head, eval_batch_size=5, attention_stats=True)(
        stack(params), stack(rest), split, None, jnp.ones(1)
    )
    s = task.splits["test"]
    _, want = nets[0].body(jnp.asarray(s.inputs), jnp.asarray(s.valid), with_stats=True)
    for stat in ("entropy", "max_weight"):
        for layer in range(2):
            np.testing.assert_allclose(
                float(got[f"attn_{stat}/layer_{layer}"][0]), float(np.mean(want[stat][layer])), rtol=1e-5
            )


def test_a_run_records_each_length_in_metrics_json_and_tensorboard(tmp_path):
    """One real run (tiny MQAR at seq_len 16) with test_lengths=[16,48] and the final statistics: at 16 the ordinary
    test metrics."""
    run_dir = tmp_path / "run"
    lengths = ("task.test_lengths=[16,48]", "trainer.final_stats=true")
    train_in_process(*TINY, *tiny_task("mqar"), *lengths, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    rec = metrics(run_dir)
    final = rec["final"]
    tests = {k.split("/", 1)[1]: v for k, v in final.items() if k.startswith("test/") and k != "test/temperature"}
    assert tests and {"accuracy", "loss", "nll_ts"} <= set(tests)
    for m, v in tests.items():
        assert final[f"test_len/16/{m}"] == pytest.approx(v, rel=1e-5, abs=1e-7), m
        assert f"test_len/48/{m}" in final, m
    assert final["test_len/48/loss"] != pytest.approx(final["test/loss"], rel=1e-6)  # another split
    for T in (16, 48):
        for stat in ("attn_entropy", "attn_max_weight"):
            assert 0.0 <= final[f"test_len/{T}/{stat}/layer_0"] <= 1.0
    assert rec["baseline"]["baseline_test_len/48/accuracy"] == rec["baseline"]["baseline/accuracy"] == 1 / 8
    acc = events(run_dir)
    logged = set(acc.Tags()["scalars"])
    for key, value in final.items():
        if key.startswith("test_len/"):
            assert key in logged, key
            (event,) = acc.Scalars(key)
            assert event.step == rec["steps"] and event.value == pytest.approx(value, rel=1e-6)


def write_run(root, name, normalizer, seed, accuracy_by_length):
    """A run directory as the trainer leaves it (run.json, metrics.json) with test_len/<T>/accuracy."""
    path = root / name
    path.mkdir(parents=True)
    cfg = {"normalizer": {"_target_": "x"}, "seed": seed, "task": {"seq_len": 16}}
    (path / "run.json").write_text(
        json.dumps(
            {
                "config": cfg,
                "choices": {"normalizer": normalizer},
                "overrides": [f"normalizer={normalizer}", f"seed={seed}"],
            }
        )
    )
    final = {
        "test/accuracy": accuracy_by_length[16],
        "test/loss": 1.0,
        **{f"test_len/{t}/accuracy": a for t, a in accuracy_by_length.items()},
        **{f"test_len/{t}/loss": 2.0 for t in accuracy_by_length},
    }
    (path / "metrics.json").write_text(
        json.dumps({"status": "completed", "final": final, "best": final, "headline": "test/accuracy"})
    )


def test_the_report_tabulates_the_headline_metric_per_length(tmp_path, capsys):
    from attnlab.report.cli import cli

    values = {
        ("softmax", 0): {16: 0.9, 64: 0.5, 256: 0.2},
        ("softmax", 1): {16: 0.8, 64: 0.45, 256: 0.3},
        ("softmax", 2): {16: 0.95, 64: 0.55, 256: 0.1},
        ("ssmax", 0): {16: 0.9, 64: 0.8, 256: 0.7},
        ("ssmax", 1): {16: 0.85, 64: 0.75, 256: 0.6},
    }
    for i, ((norm, seed), acc) in enumerate(values.items()):
        write_run(tmp_path / "sweep", f"{i}_normalizer={norm},seed={seed}", norm, seed, acc)
    assert cli([str(tmp_path / "sweep"), "--curves"]) == 0
    report = (tmp_path / "sweep" / "report" / "report.md").read_text()
    section = report.split("## Length generalisation: test accuracy per test length")[1]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in section.splitlines()
        if line.startswith("| softmax") or line.startswith("| ssmax")
    }
    assert "| normalizer | 16 | 64 | 256 |" in section
    for norm in ("softmax", "ssmax"):
        for col, T in enumerate((16, 64, 256)):
            x = np.array([a[T] for (n, _), a in values.items() if n == norm])
            half = sps.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))  # Student t below 5 seeds
            lo, hi = max(x.mean() - half, 0.0), min(x.mean() + half, 1.0)
            assert rows[norm][col] == f"{x.mean():.3g} ± {x.std(ddof=1):.3g} [{lo:.3g}, {hi:.3g}]", (norm, T)
    with open(tmp_path / "sweep" / "report" / "lengths.csv") as f:
        lines = f.read().splitlines()
    assert lines[0] == "normalizer,metric,length,n,mean,std,ci_low,ci_high" and len(lines) == 1 + 2 * 3
    assert (tmp_path / "sweep" / "report" / "lengths.png").stat().st_size > 1000


def length_table_rows(report_md: str) -> dict[str, list[str]]:
    """{normalizer: its cells} of the report's length table."""
    section = report_md.split("## Length generalisation")[1]
    return {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| normalizer")
    }


def test_the_length_table_bootstraps_with_the_requested_n_boot_and_seed(tmp_path):
    from attnlab.report.cli import cli

    rng = np.random.default_rng(3)
    acc = {s: {16: 0.9, 64: float(x)} for s, x in enumerate(rng.uniform(0.2, 0.8, 6))}  # 6 seeds: bootstrapped
    for seed, by_length in acc.items():
        write_run(tmp_path / "sweep", f"{seed}_normalizer=ssmax,seed={seed}", "ssmax", seed, by_length)

    def interval(n_boot, seed):
        out = tmp_path / f"report_{n_boot}_{seed}"
        args = ["--group-by", "normalizer", "--curves", "--n-boot", str(n_boot), "--seed", str(seed), "--out", str(out)]
        assert cli([str(tmp_path / "sweep"), *args]) == 0
        return length_table_rows((out / "report.md").read_text())["ssmax"][1].split("[")[1]

    x = np.array([acc[s][64] for s in sorted(acc)])
    for n_boot, seed in ((300, 7), (1000, 8)):
        # numpy's percentile bootstrap of the mean, drawn here from the same generator and seed.
        means = x[np.random.default_rng(seed).integers(0, len(x), (n_boot, len(x)))].mean(axis=1)
        lo, hi = np.percentile(means, [2.5, 97.5])
        assert interval(n_boot, seed) == f"{lo:.3g}, {hi:.3g}]"
    assert interval(300, 7) == interval(300, 7)  # the same seed, the same interval
    assert interval(300, 7) != interval(300, 9)
