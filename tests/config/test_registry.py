"""Every choice of every config group composes and builds (objects only, nothing trained)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from cli_helpers import compose_train, tiny_task
from omegaconf import OmegaConf

from attnlab.cli import ConfigError
from attnlab.config import composition, registry
from attnlab.config.assembly import assemble

GROUPS = ("normalizer", "task", "head", "model", "optim", "trainer", "accelerator")


# Building a GPU-sized model (d_model 512 and up: base, llama_60m, llama_125m) draws its millions of parameters on
# the CPU: `-m long` builds them; the default suite composes and builds the CPU-sized ones.
GPU_SIZED = 512


def cases():
    for group in GROUPS:
        for choice in registry.choices(group):
            yield group, choice


def built_cases():
    """cases(), a GPU-sized model's under `-m long`."""
    for group, choice in cases():
        gpu_sized = group == "model" and registry.load(group, choice).get("d_model", 0) >= GPU_SIZED
        yield pytest.param(group, choice, marks=[pytest.mark.long] if gpu_sized else [])


@pytest.mark.parametrize("group, choice", list(built_cases()))
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
    cfg = compose_train(*overrides, *tiny_task(task))
    assert cfg[group] is not None
    head = cfg.task.default_head if group != "head" else choice
    task_obj, nets, tx, loop = assemble(cfg, head)
    assert task_obj.kind in ("classification", "regression")
    assert len(nets) == cfg.trainer.vmap_seeds and len(nets[0].body.blocks) == cfg.model.layers
    assert loop.steps == cfg.trainer.steps


def test_head_of_the_wrong_kind_is_refused_before_building():
    cfg = compose_train("task=mqar", "head=mse", *tiny_task("mqar"))
    with pytest.raises(ConfigError, match="heads for classification: scores_mse, softmax_ce"):
        assemble(cfg, "mse")


@pytest.mark.parametrize(
    "target, said",
    [
        ("os.system", "a builtin_function_or_method"),  # refused before it could be called
        ("subprocess.Popen", "class Popen"),
        ("attnlab.heads.MSE", "class MSE"),  # an attnlab class, but no normalizer
        ("attnlab.normalizers.NoSuch", "no such attribute"),
    ],
)
def test_a_target_that_is_no_subclass_of_its_groups_contract_is_refused(target, said):
    with pytest.raises(ConfigError) as refused:
        registry.resolve_target(target, "normalizer")
    assert str(refused.value) == (
        f"normalizer _target_ '{target}' refused ({said}): "
        "a normalizer must be a class subclassing attnlab.normalizers.base.Normalizer"
    )


# The last commit whose group YAMLs each spelled out every key (before `defaults:` inheritance).
WRITTEN_OUT = "357e3ba"


def written_out(group: str, choice: str) -> dict:
    """The YAML of `group/choice` at WRITTEN_OUT, read from git."""
    repo = Path(__file__).resolve().parents[2]
    path = f"src/attnlab/configs/{group}/{choice}.yaml"  # where configs/ lived then
    try:
        shown = subprocess.run(["git", "show", f"{WRITTEN_OUT}:{path}"], cwd=repo, capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if shown.returncode != 0:
        pytest.skip(f"{path} at {WRITTEN_OUT} is not in this checkout's history (a shallow clone, or no git)")
    return yaml.safe_load(shown.stdout)


def written_out_cases() -> list[tuple[str, str]]:
    """The choices that existed at WRITTEN_OUT (a choice added since was never written out); every choice where git
    or the history is missing, so that each test then says why it cannot read its YAML."""
    repo = Path(__file__).resolve().parents[2]
    try:
        listed = subprocess.run(
            ["git", "ls-tree", "-r", "--name-only", WRITTEN_OUT, "src/attnlab/configs"],
            cwd=repo,
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        return list(cases())
    if listed.returncode != 0:
        return list(cases())
    paths = set(listed.stdout.split())
    return [(g, c) for g, c in cases() if f"src/attnlab/configs/{g}/{c}.yaml" in paths]


@pytest.mark.parametrize("group, choice", written_out_cases())
def test_inheritance_keeps_every_key_and_value_of_the_written_out_yaml(group, choice):
    composed = compose_train(f"{group}={choice}")
    node = OmegaConf.to_container(composed[group])
    assert node == registry.load(group, choice)  # Hydra and the registry compose a group file the same way
    assert not any(k.startswith("_") for k in node if k != "_target_")
    before = written_out(group, choice)
    assert (
        "defaults" not in node and registry.name_of(group, registry.resolve_target(node["_target_"], group)) is not None
    )
    if group == "accelerator":  # the group's _target_, which it lacked
        node.pop("_target_")
    assert {k: v for k, v in node.items() if k in before} == before  # keys added since (new options) aside


def test_a_variant_states_only_what_differs_from_its_base():
    for group, base in [("model", "_transformer_"), ("accelerator", "_platform_"), ("normalizer", "_scored_")]:
        shared = yaml.safe_load((registry.CONFIG_DIR / group / f"{base}.yaml").read_text())
        for choice in registry.choices(group):
            own = yaml.safe_load((registry.CONFIG_DIR / group / f"{choice}.yaml").read_text())
            if base in own.get("defaults", []):
                restated = {k for k in set(own) & set(shared) if own[k] == shared[k]}
                assert not restated, f"{group}/{choice}.yaml restates {sorted(restated)} of {base}.yaml"


def test_a_base_file_is_no_choice(capsys):
    assert not any(name.startswith("_") for group in GROUPS for name in registry.choices(group))
    with pytest.raises(SystemExit) as exited:
        composition.compose_or_exit(["normalizer=_scored_"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "attnlab: error: normalizer=_scored_ unknown (a base its choices inherit, no choice itself); "
        f"allowed: {', '.join(registry.choices('normalizer'))}"
    )
