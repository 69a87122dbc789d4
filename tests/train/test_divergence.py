"""Divergence is a status: real runs with huge learning rates end `diverged`, nothing non-finite is logged or
reported, and the skip policy keeps the last finite parameters."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from cli_helpers import TINY, compose_train, events, metrics, tiny_task, train_in_process
from flax import nnx
from tensorboard.plugins.hparams import metadata

from attnlab import exits
from attnlab.config.assembly import assemble
from attnlab.model.groups import leaf_groups
from attnlab.optim import scale_by_rate
from attnlab.steps import make_train_step
from attnlab.train.state import fresh_state

RUN = [
    *TINY,
    *tiny_task("mqar"),
    "trainer.steps=40",
    "trainer.log_every=2",
    "trainer.eval_every=4",
    "optim.warmup_steps=0",
]


def finite_tree(value) -> bool:
    """Every number in a JSON record is finite (a NaN written by json.dumps reads back as float nan)."""
    if isinstance(value, dict):
        return all(finite_tree(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_tree(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


@pytest.mark.parametrize("lr", ["1e5", "1000"])
def test_huge_learning_rate_ends_diverged_with_finite_records_and_events(tmp_path, lr):
    run_dir = tmp_path / "r"
    proc = train_in_process(*RUN, f"optim.lr={lr}", f"hydra.run.dir={run_dir}", cwd=tmp_path, check=False)
    m = metrics(run_dir)
    assert proc.returncode == exits.DIVERGED, proc.stderr[-2000:]
    assert m["status"] == "diverged" and 1 <= m["diverged"]["step"] <= m["steps"] < 40, m
    # the skipped share passed trainer.max_skipped=0.1 of 40 steps: stopped at the first logging step after
    assert m["nonfinite_steps"] > 4 and m["steps"] <= m["nonfinite_steps"] + m["diverged"]["step"] + 2
    assert finite_tree(m) and all(np.isfinite(v) for v in m["final"].values())
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("attnlab: run diverged")]
    assert len(lines) == 1 and f"at step {m['diverged']['step']}:" in lines[0] and "max_skipped" in lines[0]
    hint = f"try a smaller learning rate, e.g. optim.lr={float(lr) / 10:.3g} (this run: optim.lr={float(lr):.3g})"
    assert hint in lines[0] and hint in proc.stdout  # the summary's diverged line says it too
    assert "Traceback" not in proc.stderr and "NaN or Inf" not in proc.stderr
    assert "status: diverged" in proc.stdout
    acc = events(run_dir)  # TensorBoard's own reader: no NaN/Inf scalar or histogram bucket was written
    for tag in acc.Tags()["scalars"]:
        assert all(np.isfinite(e.value) for e in acc.Scalars(tag)), tag
    for tag in acc.Tags()["histograms"]:
        for e in acc.Histograms(tag):
            assert np.isfinite([e.histogram_value.min, e.histogram_value.max, e.histogram_value.sum]).all(), tag
    assert json.loads((run_dir / "diverged.json").read_text())["first_nonfinite_step"] == m["diverged"]["step"]
    start = metadata.parse_session_start_info_plugin_data(
        acc.PluginTagToContent("hparams")[metadata.SESSION_START_INFO_TAG]
    )
    assert start.hparams["status"].string_value == "diverged"  # the HParams tab can filter on it


def test_skip_policy_keeps_the_last_finite_parameters():
    """From the third step on the learning rate overflows (inf: lr·g is ±inf, or NaN where g = 0) while loss and
    gradient stay finite: the step must keep the parameters after step 2 (a gradient-only check applied it)."""
    cfg = compose_train("model=tiny", "task=mqar", *tiny_task("mqar"))
    task, nets, _, _ = assemble(cfg, "softmax_ce")
    # The rate last, as attnlab.optim's chains apply it: the step reads opt/lr from its state.
    tx = optax.chain(optax.sgd(1.0), scale_by_rate(lambda count: jnp.where(count < 2, 1e-2, jnp.inf)))
    graphdef, params, _ = nnx.split(nets[0], nnx.Param, ...)
    groups, layers = leaf_groups(params)
    state = fresh_state([nets[0]], tx, seed=0)
    data = jax.device_put(task.batches(8))
    step = make_train_step(
        graphdef,
        tx,
        groups=groups,
        layers=layers,
        num_layers=len(nets[0].body.blocks),
        num_heads=nets[0].body.blocks[0].attn.num_heads,
        batch_size=8,
        batch_sharding=None,
    )
    for _ in range(2):
        state, m = step(state, data)
    assert int(m["nonfinite"][0]) == 0
    last_finite = jax.tree.map(lambda x: np.array(x, copy=True), state["params"])
    for _ in range(3):
        state, m = step(state, data)
        assert np.isfinite(float(m["loss"][0])) and np.isfinite(float(m["grad_norm"][0, 0]))
    assert int(m["nonfinite"][0]) == 3 and int(m["first_nonfinite"][0]) == 2  # 0-based: the third step
    for want, got in zip(jax.tree.leaves(last_finite), jax.tree.leaves(state["params"])):
        np.testing.assert_array_equal(np.asarray(got), want)
