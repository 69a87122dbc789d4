"""The loop's phases alone: best-val selection per seed (evaluate_step) against a numpy reference."""

import math
import types

import numpy as np

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
        probe={"inputs": None, "valid": None}, baseline={"val": {"loss": 9.0}})
    summaries = [_Recorder() for _ in range(S)]
    metrics = {"attn": {"beta": np.array([[1.5, np.nan], [2.0, 3.0], [np.nan, np.nan]])}}

    got = evaluate_step(10, {"params": params_now, "rest": None}, best, params_best, evaluator, summaries,
                        metrics, loss_is_nll=False)

    improved = np.array([v < b for v, b in zip(val_losses, [1.0, math.inf, 0.5])])  # [F, T, T]
    for k in params_now:
        want = np.where(improved.reshape((-1,) + (1,) * (params_now[k].ndim - 1)), params_now[k], params_best[k])
        np.testing.assert_array_equal(np.asarray(got[k]), want)
    assert best[0] == {"val/loss": 1.0, "step": 5}
    assert best[1] == {"val/loss": 3.0, "val/accuracy": 0.7, "step": 10}
    assert best[2] == {"val/loss": 0.1, "val/accuracy": 0.99, "step": 10}
    for i, rec in enumerate(summaries):
        assert rec.scalars_at[10] == {"val/loss": val_losses[i], "val/accuracy": 1 - val_losses[i] / 10,
                                      "baseline_val/loss": 9.0}
        assert rec.images == 1
    # NaN marks a layer without the statistic: seed 0 logs one β, seed 1 two, seed 2 none.
    assert [r.histograms for r in summaries] == [[("hist/beta", [1.5], 10)], [("hist/beta", [2.0, 3.0], 10)], []]


def test_logging_never_changes_the_parameters():
    """A logging step (statistics program + train step, as `fit` compiles them) on every step trains bit for
    bit like plain steps only: statistics, score probes and their dense autodiff never feed the update."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from attnlab import cli
    from attnlab.groups import leaf_groups
    from attnlab.steps import probes_supported
    from attnlab.train import compile_steps, pad_split
    from cli_helpers import TINY_TASK
    from test_configs import compose_train

    cfg = compose_train("model=tiny", "task=mqar", *TINY_TASK["mqar"], "model.dropout=0.1", "accelerator=cpu")
    task, nets, tx, loop = cli.build(cfg, "softmax_ce")
    net = nets[0]
    graphdef, params, rest = nnx.split(net, nnx.Param, ...)
    groups, layers = leaf_groups(params)
    one = lambda tree: jax.tree.map(lambda x: jnp.asarray(x)[None], tree)  # noqa: E731

    def initial():
        state = {"params": one(params), "rest": one(rest), "step": jnp.zeros((1,), jnp.int32),
                 "nonfinite": jnp.zeros((1,), jnp.int32), "first_nonfinite": jnp.full((1,), -1, jnp.int32),
                 "key": jax.random.key_data(jax.random.key(0))[None]}
        return {**state, "opt_state": jax.vmap(tx.init)(state["params"])}

    data = jax.tree.map(jnp.asarray, pad_split(task.splits["train"], 1))
    steps = compile_steps(graphdef, tx, initial(), data, types.SimpleNamespace(batch_size=8),
                          types.SimpleNamespace(batch=None), groups=groups, layers=layers,
                          num_layers=len(net.body.blocks), num_heads=net.body.blocks[0].attn.num_heads,
                          probe_scores=probes_supported(net), num_seeds=1)
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
