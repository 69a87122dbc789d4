"""Every head × every task of its kind trains one step through the model with finite gradients."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from cli_helpers import tiny_task
from flax import nnx
from hydra import compose, initialize_config_dir

from attnlab import config
from attnlab.config import registry
from attnlab.config.assembly import assemble


def pairs():
    for task in registry.choices("task"):
        kind = registry.resolve_target(registry.load("task", task)["_target_"], "task").kind
        for head in config.heads_for(kind):
            yield task, head


@pytest.mark.parametrize("task_name, head_name", list(pairs()))
def test_one_step_has_finite_gradients_and_lowers_the_loss(task_name, head_name):
    with initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "train", overrides=["model=tiny", f"task={task_name}", f"head={head_name}", *tiny_task(task_name)]
        )
    task, (net,), _, _ = assemble(cfg, head_name)
    split = task.splits["train"]
    batch = {k: getattr(split, k)[:16] for k in ("inputs", "targets", "weights", "valid")}
    graphdef, params, rest = nnx.split(net, nnx.Param, ...)

    def loss_fn(p):
        n = nnx.merge(graphdef, p, rest)
        feats, _ = n.body(batch["inputs"], batch["valid"])
        return n.head.loss(n.head(feats), batch["targets"], batch["weights"])

    loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    leaves = jax.tree.leaves(grads)
    assert np.isfinite(float(loss)) and all(np.all(np.isfinite(g)) for g in leaves)
    assert sum(float(np.sum(np.square(g))) for g in leaves) > 0
    # A small gradient step on the same batch lowers the loss: the gradient is the loss's.
    new = jax.tree.map(lambda p, g: p - 1e-3 * g / (optax.tree.norm(grads) + 1e-12), params, grads)
    assert float(jax.jit(loss_fn)(new)) < float(loss)
