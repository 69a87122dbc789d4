"""Fuzzed configuration space: every draw of overrides trains one step, or is refused in one line naming
a key it set (with its value and what is allowed) before anything compiles. Groups, choices and options
are discovered from configs/ at test time (fuzz_space.py), so options added later are fuzzed too."""

from __future__ import annotations

import math
from collections import Counter

import fuzz_space as space
import pytest
from cli_helpers import CACHE, scalar_curve, tiny_task
from fuzz_space import outcome
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from attnlab import cli
from attnlab.config import registry


@st.composite
def draws(draw, max_options: int = 3):
    """A task with its tiny sizes, maybe other choices (or an unknown one), then 1..max_options option values."""
    task = draw(st.sampled_from(registry.choices("task")))
    overrides = [f"task={task}", *tiny_task(task)]
    chosen = {"task": task, "model": "tiny"}
    defaults = {}  # option key -> its default, whose type says which drawn values are the wrong type
    for group in space.groups():
        if group == "task" or draw(st.floats(0, 1)) < 0.7:
            continue
        unknown = draw(st.floats(0, 1)) < 0.05
        name = "no_such_choice" if unknown else draw(st.sampled_from(registry.choices(group)))
        overrides.append(f"{group}={name}")
        chosen[group] = name
    for _ in range(draw(st.integers(1, max_options))):
        group = draw(st.sampled_from(["", *space.groups()]))
        if group == "":
            opts = space.run_level()
        else:
            name = chosen.get(group) or _default_choice(group, task)
            if group not in chosen:  # head: null in train.yaml has no node to override until chosen
                chosen[group] = name
                overrides.append(f"{group}={name}")
            opts = space.options(group, name) if name in registry.choices(group) else {}
        if draw(st.floats(0, 1)) < 0.05:  # a key no YAML of the group has
            overrides.append(f"+{group or 'trainer'}.no_such_option=1")
            continue
        if not opts:
            continue
        key = draw(st.sampled_from(sorted(opts)))
        overrides.append(draw(space.option_override(group, key, opts[key])))
        defaults[overrides[-1].split("=", 1)[0]] = opts[key]
    return overrides, defaults


def _default_choice(group: str, task: str) -> str:
    if group == "head":
        return registry.load("task", task)["default_head"]
    return {"model": "tiny", **space.train_defaults()}.get(group, "")


def keys_of(overrides: list[str]) -> set[str]:
    """The leaf names a refusal may cite for these overrides (`model.d_model` -> d_model, model)."""
    keys = set()
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        keys |= {key, key.rsplit(".", 1)[-1]}
    return keys


def train_one_step(cfg, built, tmp_dir):
    """Train the built run for one step (log, eval and checkpoint on it) and return (record, step-1 loss)."""
    task, nets, tx, loop = built
    loop = type(loop)(
        **{
            **loop.__dict__,
            "steps": 1,
            "log_every": 1,
            "eval_every": 1,
            "checkpoint_every": 0,
            "progress": "none",
            "resume": False,
        }
    )
    hparams = [{"seed": str(cfg.seed)}]
    record = cli._train(cfg, task, nets[:1], tx, loop, [tmp_dir], tmp_dir, hparams, None)[0]
    return record, scalar_curve(tmp_dir, "train/loss")


def test_a_string_option_is_drawn_from_every_choice_its_comment_lists():
    """model.output_gate defaults to none in every YAML; its comment lists the rest (none | headwise | elementwise)."""
    assert space.near("none", "output_gate") == ["elementwise", "headwise", "none"]
    assert {"learned", "sinusoidal", "rope", "none"} <= set(space.near("learned", "positional"))


FIXED = [  # a structural number 0, a rate above 1, a GPU that is not there
    ["model.heads=0"],
    ["model.d_model=0"],
    ["model.layers=0"],
    ["model.mlp_ratio=-1"],  # 0 is an attention-only block
    ["model.dropout=1.5"],
    ["model.dropout=-0.1"],
    ["accelerator=gpu"],
    ["accelerator=tpu"],
]


@pytest.mark.parametrize("overrides", FIXED, ids=" ".join)
def test_known_bad_values_are_refused_in_one_line_naming_the_key(overrides):
    kind, message = outcome(["task=mqar", *tiny_task("mqar"), *overrides])
    assert kind == "refused", message
    assert "\n" not in message and overrides[0].split("=")[0] in message and "allowed" in message, message


def wrong_type(override: str, default) -> bool:
    """Whether a drawn value cannot be of the option's type (its default's): then it must be refused."""
    value = override.split("=", 1)[1]
    if isinstance(default, bool):
        return value not in ("true", "false")
    if isinstance(default, int):
        return value in ("abc", "true", "''", "1.5", "1e30", "nan", "inf", "null", "0.5", "-0.001")
    if isinstance(default, float):
        return value in ("abc", "true", "''", "nan", "inf", "null")
    if isinstance(default, str):
        # (true/false may be valid: an option like trainer.resume may take either)
        return value in ("0", "-1", "1000000000000", "1e30", "-0.001", "1.5", "nan", "inf", "0.5", "2", "1")
    return False


def _check(draw, stats, tmp_path_factory, train_budget):
    """Per draw: a refusal is one line naming a key the draw set; an accepted draw took no value of the wrong type
    and, while the budget lasts (always for an example that expects it), trains a step to a finite loss. An
    explicit example (overrides, defaults, expected) also says which of the two it must be."""
    overrides, defaults, *expected = draw
    kind, detail = outcome(overrides)
    stats[kind] += 1
    assert kind != "bug", f"{overrides}: {type(detail).__name__}: {detail}"
    if expected:
        assert kind == ("accepted" if expected == ["trains"] else "refused"), (overrides, kind, detail)
    if kind == "refused":
        assert detail and "\n" not in detail, (overrides, detail)
        assert any(k in detail for k in keys_of(overrides)), f"{overrides}: message names no key set: {detail}"
        return
    last = {o.split("=", 1)[0]: o for o in overrides}  # Hydra: the last value of a key wins
    wrong = [o for key, o in last.items() if key in defaults and wrong_type(o, defaults[key])]
    assert not wrong, f"{overrides}: accepted a value of the wrong type: {wrong}"
    if stats["trained"] >= train_budget and expected != ["trains"]:
        return
    cfg, built = detail
    record, curve = train_one_step(cfg, built, tmp_path_factory.mktemp("fuzz"))
    stats["trained"] += 1
    assert record["status"] in ("completed", "diverged"), (overrides, record)
    assert [s for s, _ in curve] == [1] and math.isfinite(curve[0][1]), (overrides, curve)


MQAR = ["task=mqar", *tiny_task("mqar")]
ICL = ["task=icl_regression", *tiny_task("icl_regression")]
BB = ["task=bigram_backcopy", *tiny_task("bigram_backcopy")]


def _fuzz(tmp_path_factory, n, train_budget):
    import jax

    jax.config.update("jax_compilation_cache_dir", str(CACHE))
    stats = Counter()

    @settings(max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(draws())
    @example((["model.heads=0"], {"model.heads": 2}, "refused")).via("a structural number")
    @example((["model.dropout=1.5"], {"model.dropout": 0.0}, "refused")).via("a rate above 1")
    @example((["accelerator=gpu"], {}, "refused")).via("a missing GPU")
    @example(([*BB, "model.max_len=''"], {"model.max_len": 512}, "refused")).via("a length compared before the model")
    @example(([*MQAR, "normalizer=differential", "model.output_gate=headwise"], {}, "trains")).via("a gated model")
    @example(([*ICL, "head=hlgauss", "normalizer=kl", "model.layers=1"], {}, "trains")).via("a regression head")
    def prop(draw):
        _check(draw, stats, tmp_path_factory, train_budget)

    prop()
    print(f"\nfuzz: {n} draws: {dict(stats)}")
    return stats


def test_fuzzed_configurations_train_or_are_refused_in_one_line(tmp_path_factory):
    """20 fixed draws and the explicit examples; `-m long` draws 300 (test_fuzzed_configurations_hundreds)."""
    _fuzz(tmp_path_factory, n=20, train_budget=1)


@pytest.mark.long  # ~2 min: each draw is a Hydra composition (~0.25 s)
def test_fuzzed_configurations_hundreds(tmp_path_factory):
    _fuzz(tmp_path_factory, n=300, train_budget=3)


@pytest.mark.slow
def test_fuzzed_configurations_thousands(tmp_path_factory):
    _fuzz(tmp_path_factory, n=3000, train_budget=20)
