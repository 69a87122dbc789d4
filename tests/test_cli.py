"""The training CLI through the real Hydra entry point: runs, records, TensorBoard, errors, devices."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cli_helpers import TINY, events, metrics, run_cli, scalar_curve, tiny_task, train_in_process

from attnlab import config
from attnlab.config import registry
from attnlab.statistics import CORE_STATS

NORMALIZERS = registry.choices("normalizer")


def sweep(tmp_path, task, normalizers, head_names):
    """A Hydra multirun of normalizers × heads on a tiny task; every run completes with finite metrics."""
    train_in_process(
        "-m",
        f"task={task}",
        f"normalizer={','.join(normalizers)}",
        f"head={','.join(head_names)}",
        *TINY,
        *tiny_task(task),
        f"hydra.sweep.dir={tmp_path}",
        cwd=tmp_path,
    )
    runs = sorted(p for p in tmp_path.iterdir() if (p / "metrics.json").exists())
    assert len(runs) == len(normalizers) * len(head_names)
    for run in runs:
        m = metrics(run)
        assert m["status"] == "completed", (run.name, m.get("error"))
        assert m["steps"] == 4
        finals = {k: v for k, v in m["final"].items() if k.startswith("test/")}
        assert finals and all(math.isfinite(v) for v in finals.values()), (run.name, finals)


@pytest.mark.parametrize(
    "task, normalizers, head_names",
    [
        # every normalizer (~70 s a half at -O0) and the regression heads: `long`; two halves balance the xdist
        # workers; the default suite trains the classification head without a final softmax
        pytest.param("mqar", NORMALIZERS[: len(NORMALIZERS) // 2], ["softmax_ce"], marks=pytest.mark.long),
        pytest.param("mqar", NORMALIZERS[len(NORMALIZERS) // 2 :], ["softmax_ce"], marks=pytest.mark.long),
        ("mqar", ["softmax", "linear"], ["scores_mse"]),
        pytest.param("icl_regression", ["softmax", "squared"], ["mse", "hlgauss"], marks=pytest.mark.long),
    ],
)
def test_every_normalizer_and_every_head_trains(tmp_path, task, normalizers, head_names):
    """Each normalizer and each head trains through the real entry point (a covering subset of the grid)."""
    sweep(tmp_path, task, normalizers, head_names)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["mqar", "icl_regression"])
def test_every_normalizer_times_every_compatible_head_trains(tmp_path, task):
    """The full grid: every normalizer × every head serving the task's kind (~4 min on 2 cores)."""
    kind = "classification" if task == "mqar" else "regression"
    sweep(tmp_path, task, NORMALIZERS, config.heads_for(kind))


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One tiny single run of the default task, with its run directory."""
    root = tmp_path_factory.mktemp("run")
    run_dir = root / "out"
    proc = train_in_process(
        *TINY, *tiny_task("mqar"), "normalizer=kl", "model.layers=2", f"hydra.run.dir={run_dir}", cwd=root
    )
    return run_dir, proc


def test_run_record_has_the_documented_keys(default_run):
    run_dir, proc = default_run
    m = metrics(run_dir)
    assert m["status"] == "completed"
    for key in ("final", "best", "baseline", "steps", "wall_time_s", "compile_time_s", "steps_per_sec"):
        assert key in m
    from attnlab.statistics import STATISTICS, directions

    # which values of each attn_ statistic are better (None: it describes), an entry per statistic: the report's
    assert m["directions"] == directions() and {f"attn_{s.name}" for s in STATISTICS} <= set(m["directions"])
    for key in ("test/accuracy", "val/loss", "test/ece", "test/nll", "test/temperature", "test/ece_ts"):
        assert key in m["final"], key
    assert m["baseline"]["baseline/accuracy"] == pytest.approx(1 / 8)  # 16-token vocab: 8 values
    assert m["best"]["step"] == 4
    timing = m["timing"]  # every phase, none counted twice
    phases = ("build", "compile", "train_loop", "evaluation", "final_metrics", "images", "checkpoints")
    assert set(timing) == {*phases, "total"} and all(timing[k] >= 0 for k in timing)
    assert sum(timing[k] for k in phases) <= timing["total"] <= m["wall_time_s"] + 1e-9
    assert m["steps_per_sec"] == pytest.approx(4 / timing["train_loop"])
    # the temperature was fitted on every val query position (40 examples × 2 queries): under the cap
    assert m["final"]["val/positions_ts"] == 80 and "test/positions_ts" not in m["final"]
    import json

    run = json.loads((run_dir / "run.json").read_text())
    assert run["choices"]["normalizer"] == "kl" and run["choices"]["head"] == "softmax_ce"
    assert run["config"]["normalizer"]["_target_"] == "attnlab.normalizers.KL"
    assert "trainer.steps=4" in run["overrides"]
    assert set(run["env"]["git"]) == {"sha", "dirty"} and run["env"]["versions"]["jax"]
    assert run["env"]["devices"] and "model=tiny" in run["env"]["command"]
    # on CPU in float32 kl runs its dense form in every layer, matmuls in full float32
    assert (
        run["attention_impl"] == ["dense"] * run["config"]["model"]["layers"] and run["matmul_precision"] == "highest"
    )
    assert run["compute_dtype"] == "float32" and "attention_impl per layer: dense" in proc.stderr
    assert str(run_dir) in proc.stdout and "test/accuracy" in proc.stdout and "baseline" in proc.stdout
    assert "time (s):" in proc.stdout and "train_loop" in proc.stdout


def test_a_run_records_tokens_per_second_and_no_mfu_on_a_cpu(default_run):
    """run.throughput: tokens/s = steps/s · B · T · seeds in metrics.json and TensorBoard, PaLM's FLOPs per token,
    MFU n/a on a CPU (no peak), the parameter count printed."""
    run_dir, proc = default_run
    m = metrics(run_dir)
    config = json.loads((run_dir / "run.json").read_text())["config"]
    B, T, S = config["trainer"]["batch_size"], config["task"]["seq_len"], m["vmapped_seeds"]
    L, D = config["model"]["layers"], config["model"]["d_model"]
    assert m["model_flops_per_token"] == 6 * m["params"]["non_embedding"] + 12 * L * T * D
    np.testing.assert_allclose(m["tokens_per_sec"], m["steps_per_sec"] * B * T * S, rtol=1e-9)
    assert m["mfu"] is None and "MFU n/a" in proc.stdout and f"{m['params']['total']:,} parameters" in proc.stdout
    steps = dict(scalar_curve(run_dir, "perf/steps_per_sec"))
    tokens = dict(scalar_curve(run_dir, "perf/tokens_per_sec"))
    assert steps.keys() == tokens.keys() and steps
    np.testing.assert_allclose([tokens[s] for s in steps], [steps[s] * B * T * S for s in steps], rtol=1e-5)
    assert "perf/mfu" not in events(run_dir).Tags()["scalars"]


def test_a_single_run_prints_its_tensorboard_command_and_leaves_no_empty_file(default_run):
    run_dir, proc = default_run
    lines = proc.stdout.splitlines()
    at = lines.index(f"curves: tensorboard --logdir {run_dir} --host 127.0.0.1")
    assert lines[at + 1 : at + 3] == [  # unsmoothed, a run alone: no colour groups
        "        then open http://127.0.0.1:6006/?smoothing=0#timeseries",
        "        Custom Scalars, unsmoothed: http://127.0.0.1:6006/#custom_scalars&_smoothingWeight=0",
    ]
    m = metrics(run_dir)  # the summary's test metrics are the record's, to its 4 decimals
    assert f"  {'test/accuracy':24s} {m['final']['test/accuracy']:.4f}" in "\n".join(lines)
    empty = [p for p in run_dir.rglob("*") if p.is_file() and p.stat().st_size == 0]
    assert empty == [] and not list(run_dir.glob("*.log"))  # Hydra's job log only when something was logged


def test_tensorboard_reader_finds_per_layer_head_tags_and_hparams(default_run):
    run_dir, _ = default_run
    acc = events(run_dir)
    tags = set(acc.Tags()["scalars"])
    for layer in range(2):
        assert f"grad_norm/layer_{layer}" in tags
        assert f"score_grad/layer_{layer}" in tags
        for head in range(2):
            for stat in (*CORE_STATS, "beta", "kl_prior", "objective"):  # kl's extras
                assert f"attn_{stat}/layer_{layer}/head_{head}" in tags
    for tag in (
        "train/loss",
        "val/loss",
        "test/accuracy",
        "baseline_test/accuracy",
        "baseline_val/accuracy",
        "opt/lr",
        "perf/steps_per_sec",
        "grad_norm/global",
        "grad_norm/beta",
        "grad_norm/group/normalizer",
        "grad_norm/group/attention",
    ):
        assert tag in tags, tag
    assert [s for s, _ in scalar_curve(run_dir, "train/loss")] == [2, 4]
    assert {"hist/beta", "hist/entropy"} <= set(acc.Tags()["histograms"])
    assert {"attn_map/layer_0/head_0", "attn_map/layer_0/head_1"} <= set(acc.Tags()["images"])
    hp = acc.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in hp
    from tensorboard.plugins.hparams import plugin_data_pb2

    start = plugin_data_pb2.HParamsPluginData.FromString(hp["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["normalizer"].string_value == "kl"
    assert start.hparams["head"].string_value == "softmax_ce"
    assert start.hparams["seed"].string_value == "0"
    # Entropy is normalised to [0, 1]; β starts at 1/sqrt(head_dim) = 1/sqrt(8).
    ent = [v for _, v in scalar_curve(run_dir, "attn_entropy/layer_0/head_0")]
    assert all(0 <= v <= 1 for v in ent)
    assert scalar_curve(run_dir, "attn_beta/layer_0/head_0")[0][1] == pytest.approx(8**-0.5, rel=0.05)


def test_loss_falls_on_a_memorisable_batch(tmp_path):
    """8 training examples, batch 8, 80 steps: the train loss must drop well below its start."""
    train_in_process(
        *TINY,
        *tiny_task("mqar"),
        "task.n_train=8",
        "trainer.steps=80",
        "trainer.log_every=10",
        "trainer.eval_every=80",
        "optim.lr=1e-2",
        "optim.warmup_steps=5",
        f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
    )
    curve = [v for _, v in scalar_curve(tmp_path / "r", "train/loss")]
    assert curve[-1] < 0.3 * curve[0], curve


MQAR, ICL = tiny_task("mqar"), ["task=icl_regression", *tiny_task("icl_regression")]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["normalizer=nosuch"], "nosuch"),
        (["trainer.stepz=3"], "stepz"),
        ([*MQAR, "head=mse"], "heads for classification"),
        ([*ICL, "head=softmax_ce"], "heads for regression"),
        ([*MQAR, "model.d_model=30", "model.heads=4"], "not divisible"),
        ([*MQAR, "optim.lr=-1"], "optim.lr"),
        ([*MQAR, "normalizer=linear", "normalizer.feature_map=cosine"], "feature_map"),
        ([*MQAR, "normalizer=entmax", "normalizer.alpha=1.0"], "alpha"),
    ],
)
def test_bad_override_exits_nonzero_naming_it(tmp_path, overrides, needle):
    proc = train_in_process(*TINY, *overrides, f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert needle in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


def test_a_batch_the_devices_cannot_split_exits_nonzero_naming_it(tmp_path):
    """In a process of its own: the simulated device count is fixed when JAX starts."""
    overrides = [*MQAR, "trainer.batch_size=6", "accelerator.devices=4"]
    proc = run_cli(*TINY, *overrides, f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "divisible by the device count" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.long  # two processes, one of four CPU devices (~45 s)
def test_one_device_equals_four_devices(tmp_path):
    """The same seed on 1 and 4 simulated CPU devices gives the same loss curve (float tolerance); each run in a
    process of its own, as the device count is fixed when JAX starts."""
    curves = []
    for n in (1, 4):
        run_cli(
            *TINY,
            *tiny_task("mqar"),
            f"accelerator.devices={n}",
            "trainer.steps=6",
            "trainer.log_every=1",
            "trainer.eval_every=6",
            f"hydra.run.dir={tmp_path / str(n)}",
            cwd=tmp_path,
        )
        assert metrics(tmp_path / str(n))["status"] == "completed"
        curves.append([v for _, v in scalar_curve(tmp_path / str(n), "train/loss")])
        import json

        devices = json.loads((tmp_path / str(n) / "run.json").read_text())["env"]["devices"]
        assert len(devices) == n
    np.testing.assert_allclose(curves[0], curves[1], rtol=1e-4)
    assert len(curves[0]) == 6
