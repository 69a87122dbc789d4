"""The loop's phases alone: best-val selection per seed (evaluate_step) against a numpy reference."""

import math
import types

import jax
import numpy as np
import pytest
from cli_helpers import TINY, tiny_task
from flax import nnx

from attnlab import steps
from attnlab.config import assembly
from attnlab.train.evaluation import evaluate_step


class _Recorder:
    """Stands in for one seed's Summaries: keeps what the phase wrote."""

    def __init__(self):
        self.scalars_at, self.images, self.histograms = {}, 0, []

    def scalars(self, step, values):
        self.scalars_at.setdefault(step, {}).update(values)

    def attention_images(self, maps, step):
        self.images += 1

    def histogram(self, tag, values, step):
        self.histograms.append((tag, np.asarray(values).tolist(), step))


def test_evaluate_step_keeps_each_seeds_best_params_and_metrics():
    S = 3
    rng = np.random.default_rng(0)
    params_now = {"w": rng.normal(size=(S, 4, 2)).astype(np.float32), "b": rng.normal(size=(S, 2)).astype(np.float32)}
    params_best = {"w": rng.normal(size=(S, 4, 2)).astype(np.float32), "b": rng.normal(size=(S, 2)).astype(np.float32)}
    val_losses = [2.0, 3.0, 0.1]
    best = [{"val/loss": 1.0, "step": 5}, {"val/loss": math.inf}, {"val/loss": 0.5, "step": 5}]
    evaluator = types.SimpleNamespace(
        run=lambda params, rest, split: ([{"loss": v, "accuracy": 1 - v / 10} for v in val_losses], None),
        maps=lambda params, rest, inputs, valid: np.zeros((S, 1, 1, 2, 2)),
        shown={"inputs": None, "valid": None},
        baseline={"val": {"loss": 9.0}},
    )
    summaries = [_Recorder() for _ in range(S)]
    metrics = {"attn": {"beta": np.array([[1.5, np.nan], [2.0, 3.0], [np.nan, np.nan]])}}

    got = evaluate_step(
        10, {"params": params_now, "rest": None}, best, params_best, evaluator, summaries, metrics, loss_is_nll=False
    )

    improved = np.array([v < b for v, b in zip(val_losses, [1.0, math.inf, 0.5])])  # [F, T, T]
    for k in params_now:
        want = np.where(improved.reshape((-1,) + (1,) * (params_now[k].ndim - 1)), params_now[k], params_best[k])
        np.testing.assert_array_equal(np.asarray(got[k]), want)
    assert best[0] == {"val/loss": 1.0, "step": 5}
    assert best[1] == {"val/loss": 3.0, "val/accuracy": 0.7, "step": 10}
    assert best[2] == {"val/loss": 0.1, "val/accuracy": 0.99, "step": 10}
    for i, rec in enumerate(summaries):
        assert rec.scalars_at[10] == {
            "val/loss": val_losses[i],
            "val/accuracy": 1 - val_losses[i] / 10,
            "baseline_val/loss": 9.0,
        }
        assert rec.images == 1
    # NaN marks a layer without the statistic: seed 0 logs one β, seed 1 two, seed 2 none.
    assert [r.histograms for r in summaries] == [[("hist/beta", [1.5], 10)], [("hist/beta", [2.0, 3.0], 10)], []]


def test_logging_never_changes_the_parameters():
    """A logging step (statistics program + train step, as `fit` compiles them) on every step trains bit for
    bit like plain steps only: statistics, score probes and their dense autodiff never feed the update."""
    import jax
    from cli_helpers import compose_train, tiny_task
    from flax import nnx

    from attnlab.config import assembly
    from attnlab.model.groups import leaf_groups
    from attnlab.steps import probes_per_layer
    from attnlab.train.loop import compile_steps
    from attnlab.train.state import fresh_state

    cfg = compose_train("model=tiny", "task=mqar", *tiny_task("mqar"), "model.dropout=0.1", "accelerator=cpu")
    task, nets, tx, loop = assembly.assemble(cfg, "softmax_ce")
    net = nets[0]
    graphdef, params, _ = nnx.split(net, nnx.Param, ...)
    groups, layers = leaf_groups(params)

    def initial():
        return fresh_state([net], tx, seed=0)

    data = jax.device_put(task.batches(8))
    steps = compile_steps(
        graphdef,
        tx,
        initial(),
        data,
        types.SimpleNamespace(batch_size=8),
        types.SimpleNamespace(batch=None),
        groups=groups,
        layers=layers,
        num_layers=len(net.body.blocks),
        num_heads=net.body.blocks[0].attn.num_heads,
        probe_layers=probes_per_layer(net),
        num_seeds=1,
    )
    logged, plain = initial(), initial()
    for _ in range(4):  # the first step's learning rate is 0 (warmup from 0)
        logged, metrics = steps.stats(logged, data)
        plain, _ = steps.plain(plain, data)
    assert {"attn", "score_grad", "grad_norm", "loss"} <= set(metrics)  # the statistics were really computed
    leaves_logged, leaves_plain = jax.tree.leaves(logged["params"]), jax.tree.leaves(plain["params"])
    assert len(leaves_logged) == len(leaves_plain) > 10
    for a, b in zip(leaves_logged, leaves_plain):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(leaves_plain[0], jax.tree.leaves(params)[0])  # and the parameters did move


def test_phases_time_nested_work_once_and_announce_it(capsys, monkeypatch):
    from attnlab import progress

    clock = iter([0.0, 1.0, 3.0, 10.0, 20.0, 24.0])  # outer starts, inner 1→3, outer ends at 10; 20→24
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    phases = progress.Phases("lines")
    with phases("final_metrics", "final metrics"):
        with phases("images"):
            pass
    with phases("final_metrics", "again"):
        pass
    assert phases.seconds == {"images": 2.0, "final_metrics": 8.0 + 4.0}
    assert capsys.readouterr().err.splitlines() == [
        "final metrics ...",
        "final metrics: 10.0s",
        "again ...",
        "again: 4.0s",
    ]
    quiet = progress.Phases("none")
    monkeypatch.setattr(progress.time, "perf_counter", lambda: 0.0)
    with quiet("build", "building"):
        quiet.note("a note")
    assert capsys.readouterr().err == "" and quiet.seconds == {"build": 0.0}


def _whole_split_eval(graphdef, *, eval_batch_size: int, num_seeds: int = 1):
    """The reference: (params, rest, split, mse) -> (metrics, outputs) of a whole padded split, per seed."""

    def evaluate(params, rest, split, baseline_mse):
        net = nnx.merge(graphdef, params, rest)
        chunks = jax.tree.map(lambda a: a.reshape(-1, eval_batch_size, *a.shape[1:]), split)
        outs = jax.lax.map(lambda b: net.head(net.body(b["inputs"], b["valid"])[0]), chunks)
        outs = outs.reshape(-1, *outs.shape[2:])
        metrics = net.head.metrics(outs, split["targets"], split["weights"], baseline_mse=baseline_mse)
        return {"loss": net.head.loss(outs, split["targets"], split["weights"]), **metrics}, outs

    return jax.jit(steps.over_seeds(evaluate, num_seeds, (0, 0, None, None)))


@pytest.mark.parametrize(
    "task, head, vmap, scored",
    [
        ("mqar", "softmax_ce", 1, True),
        ("mqar", "softmax_ce", 1, False),
        ("mqar", "scores_mse", 2, True),
        ("icl_regression", "hlgauss", 1, True),
        ("icl_regression", "mse", 2, True),
    ],
)
def test_scanned_evaluation_matches_the_whole_split_evaluation(task, head, vmap, scored):
    """make_evaluate (metric sums over a scan of eval batches, calibration buffer; the head only at the
    task's scored positions, or at every position) against _whole_split_eval (every output of the split at
    once, head.metrics) and calibration_sample of those outputs."""
    import hydra
    import jax
    from flax import nnx

    from attnlab.config import registry
    from attnlab.config.assembly import assemble
    from attnlab.heads import calibration
    from attnlab.train.evaluation import make_evaluate
    from attnlab.train.trees import pad_split, stack

    overrides = [o for o in (*TINY, *tiny_task(task)) if not o.startswith("compile_cache")]
    with hydra.initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        cfg = hydra.compose(
            "train", overrides=[f"task={task}", *overrides, f"head={head}", f"trainer.vmap_seeds={vmap}"]
        )
    task_obj, nets, _, _ = assemble(cfg, head)
    graphdef, _, _ = nnx.split(nets[0], nnx.Param, ...)
    parts = [nnx.split(n, nnx.Param, ...) for n in nets]
    params, rest = stack([p[1] for p in parts]), stack([p[2] for p in parts])
    split = jax.device_put(pad_split(task_obj.splits["test"], 16))  # 40 examples: 3 batches, 8 padding rows
    mse = task_obj.baseline("test").get("mse")
    mse = None if mse is None else np.float32(mse)
    want, outs = _whole_split_eval(graphdef, eval_batch_size=16, num_seeds=vmap)(params, rest, split, mse)
    cap = 50  # below the 80 query positions of MQAR: the buffer fills up in the second batch
    t_S = np.array([1.7, 0.6][:vmap], np.float32)
    k = task_obj.scored_positions() if scored else None
    if scored:  # MQAR scores its num_kv_pairs=2 queries; in-context regression its query positions
        assert k == 2 if task == "mqar" else 0 < k < task_obj.seq_len
    got, sample = make_evaluate(
        graphdef, nets[0].head, eval_batch_size=16, num_seeds=vmap, max_positions=cap, scored_k=k
    )(params, rest, split, mse, t_S)
    classify = nets[0].head.kind == "classification"
    assert set(got) == set(want) | ({"ece_ts", "nll_ts", "accuracy_ts"} if classify else set())
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=2e-5, atol=1e-6, err_msg=k)
    if not classify:
        assert sample is None
        return
    y, w = split["targets"], split["weights"]
    for i in range(vmap):  # the *_ts sums: calibration's whole-split metrics of softmax(logits / T)
        z = nets[0].head.logits(outs[i]) / t_S[i]
        ts = {
            "ece_ts": calibration.ece(jax.nn.softmax(z, -1), y, w, nets[0].head.ece_bins),
            "nll_ts": calibration.nll(z, y, w),
            "accuracy_ts": calibration.accuracy(z, y, w),
        }
        for k, v in ts.items():
            np.testing.assert_allclose(float(got[k][i]), float(v), rtol=2e-5, atol=1e-6, err_msg=k)
    for i in range(vmap):
        ref = calibration.calibration_sample(nets[0].head.logits(outs[i]), split["targets"], split["weights"], cap)
        for g, r in zip(sample, ref):
            np.testing.assert_allclose(np.asarray(g[i]), np.asarray(r), rtol=1e-5, atol=1e-6)
    assert int(sample[3][0]) == cap


def test_fit_hands_its_compiled_steps_to_on_compiled(tmp_path):
    """The benchmark's hook: called once, before any step, with the compiled steps fit runs, the initial
    state and the data; raising there stops fit before it trains or checkpoints anything."""
    import jax
    from cli_helpers import compose_train

    from attnlab.accelerator import data_mesh
    from attnlab.train import fit
    from attnlab.train.loop import CompiledSteps

    cfg = compose_train("model=tiny", "task=mqar", *tiny_task("mqar"), "accelerator=cpu", "trainer.progress=none")
    task, nets, tx, loop = assembly.assemble(cfg, "softmax_ce")
    calls = []

    class Stop(Exception):
        pass

    def capture(steps, state, data):
        calls.append((steps, jax.tree.map(jax.numpy.copy, state), data))  # a copy: the step donates its state
        raise Stop

    with pytest.raises(Stop):
        fit(
            nets,
            task,
            tx,
            loop,
            mesh=data_mesh(),
            run_dirs=[tmp_path / "run"],
            checkpoint_dir=tmp_path / "ckpt",
            on_compiled=capture,
        )
    assert len(calls) == 1 and isinstance(calls[0][0], CompiledSteps)
    assert not list((tmp_path / "ckpt").glob("checkpoints/*"))  # no step ran, nothing saved
    steps, state, data = calls[0]
    assert int(state["step"][0]) == 0
    state, metrics = steps.plain(state, data)
    assert int(state["step"][0]) == 1 and np.isfinite(np.asarray(metrics["loss"])).all()


def test_each_row_group_is_scored_on_its_own_rows_for_every_seed():
    """make_evaluate's <group>/loss and <group>/accuracy (Task.row_groups, here Bigram-Backcopy's trigger and
    dormant rows) against the whole split's outputs restricted to the group's rows, seed by seed (vmapped)."""
    import hydra
    import jax
    from flax import nnx

    from attnlab.config import registry
    from attnlab.config.assembly import assemble
    from attnlab.train.evaluation import eval_split, make_evaluate
    from attnlab.train.trees import stack

    # The task's default 64 tokens × 64 positions and 250 rows per batch: the sizes at which XLA's CPU backend
    # (jax 0.10.2) gave the third seed the first one's mean over shared one-hot labels (make_evaluate's comment).
    task, vmap = "bigram_backcopy", 3
    sizes = ["task.n_train=200", "task.n_val=20", "task.n_test=250"]
    overrides = [o for o in TINY if not o.startswith("compile_cache")]
    with hydra.initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        cfg = hydra.compose("train", overrides=[f"task={task}", *overrides, *sizes, f"trainer.vmap_seeds={vmap}"])
    task_obj, nets, _, _ = assemble(cfg, "softmax_ce")
    graphdef, _, _ = nnx.split(nets[0], nnx.Param, ...)
    parts = [nnx.split(n, nnx.Param, ...) for n in nets]
    params, rest = stack([p[1] for p in parts]), stack([p[2] for p in parts])
    split = jax.device_put(eval_split(task_obj, "test", 250))
    assert {"group/trigger", "group/dormant"} <= set(split)

    def outputs(p, r):
        net = nnx.merge(graphdef, p, r)
        return net.head(net.body(split["inputs"], split["valid"])[0])

    outs = jax.jit(jax.vmap(outputs))(params, rest)
    got, _ = make_evaluate(graphdef, nets[0].head, eval_batch_size=250, num_seeds=vmap)(
        params, rest, split, None, np.ones(vmap, np.float32)
    )
    y, w = np.asarray(split["targets"]), np.asarray(split["weights"], np.float64)
    losses = []
    for group in ("trigger", "dormant"):
        g = np.asarray(split[f"group/{group}"]) * w
        for i in range(vmap):
            logits = np.asarray(outs[i], np.float64)
            logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
            logp -= logits.max(-1, keepdims=True)
            nll = -np.take_along_axis(logp, y[..., None], -1)[..., 0]
            hit = logits.argmax(-1) == y
            np.testing.assert_allclose(float(got[f"{group}/loss"][i]), (g * nll).sum() / g.sum(), rtol=1e-5)
            np.testing.assert_allclose(float(got[f"{group}/accuracy"][i]), (g * hit).sum() / g.sum(), rtol=1e-5)
            losses.append(float(got[f"{group}/loss"][i]))
    assert len(set(losses)) == len(losses)  # every seed and group its own number
