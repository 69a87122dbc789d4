"""Every choice of every config group composes and builds (objects only, nothing trained)."""

from __future__ import annotations

import pytest
from cli_helpers import TINY_TASK
from hydra import compose, initialize_config_dir

from attnlab import registry
from attnlab.cli import ConfigError, build

GROUPS = ("normalizer", "task", "head", "model", "optim", "trainer", "accelerator")


def compose_train(*overrides):
    with initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def cases():
    for group in GROUPS:
        for choice in registry.choices(group):
            yield group, choice


@pytest.mark.parametrize("group, choice", list(cases()))
def test_every_choice_composes_and_builds(group, choice):
    overrides = [f"{group}={choice}"]
    task = choice if group == "task" else "mqar"
    if group != "task":
        overrides.append(f"task={task}")
    if group == "head":
        task = "mqar" if choice in ("softmax_ce", "scores_mse") else "icl_regression"
        overrides = [f"head={choice}", f"task={task}"]
    if group != "model":
        overrides.append("model=tiny")
    cfg = compose_train(*overrides, *TINY_TASK[task])
    assert cfg[group] is not None
    head = cfg.task.default_head if group != "head" else choice
    task_obj, nets, tx, loop = build(cfg, head)
    assert task_obj.kind in ("classification", "regression")
    assert len(nets) == cfg.trainer.vmap_seeds and len(nets[0].body.blocks) == cfg.model.layers
    assert loop.steps == cfg.trainer.steps


def test_head_of_the_wrong_kind_is_refused_before_building():
    cfg = compose_train("task=mqar", "head=mse", *TINY_TASK["mqar"])
    with pytest.raises(ConfigError, match="heads for classification: scores_mse, softmax_ce"):
        build(cfg, "mse")


def test_only_attnlab_targets_can_be_built():
    with pytest.raises(ValueError, match="only attnlab"):
        registry.resolve_target("os.system")
