"""One way from YAML to object: every group's keys are its `_target_`'s constructor arguments (construct.build)."""

from __future__ import annotations

import pytest
from cli_helpers import tiny_task
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from attnlab import config, model, normalizers
from attnlab.checks import ConfigError
from attnlab.cli import hparams_of
from attnlab.config import composition, construct, registry
from attnlab.config.assembly import assemble


def compose_tiny(*overrides):
    with initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=["model=tiny", *tiny_task("mqar"), "trainer.steps=2", *overrides])


class GainTransformer(model.Transformer):
    """A model with one new option: the "2 places" a new model option needs (this argument, one YAML key)."""

    def __init__(self, *, gain: float = 1.0, **kwargs):  # the rest passed on: Transformer's options are its too
        super().__init__(**kwargs)
        self.gain = gain


def test_a_new_model_option_is_one_constructor_argument_and_one_yaml_key(monkeypatch, tmp_path):
    monkeypatch.setattr(model, "GainTransformer", GainTransformer, raising=False)
    configs = tmp_path / "mycfg"  # a user's config directory: the one new YAML, inheriting attnlab's tiny
    (configs / "model").mkdir(parents=True)
    (configs / "model" / "gain.yaml").write_text(  # tiny's keys, the new class and its one YAML line
        "defaults: [tiny, _self_]\n_target_: attnlab.model.GainTransformer\ngain: 1.0\n"
    )
    registry.use([str(configs)])
    try:
        cfg = compose_tiny("model=gain", "model.layers=2", "model.gain=2.5", f"hydra.searchpath=[file://{configs}]")
        _, nets, _, _ = assemble(cfg, "softmax_ce")
    finally:
        registry.use()
    body = nets[0].body
    assert isinstance(body, GainTransformer) and body.gain == 2.5 and len(body.blocks) == 2
    flat = hparams_of(cfg, {})
    assert flat["model.gain"] == 2.5 and not any("_target_" in k for k in flat)  # no _target_ column


@pytest.mark.parametrize(
    "group, name", [("model", "tiny"), ("optim", "adamw"), ("trainer", "default"), ("accelerator", "auto")]
)
def test_an_unknown_key_is_refused_naming_it_and_listing_the_yaml_keys(group, name):
    cfg = compose_tiny()
    with open_dict(cfg):  # past the command line's own check (+model.bogus=1 is refused before Hydra runs)
        cfg[group].bogus = 1
    with pytest.raises(ConfigError) as info:
        assemble(cfg, "softmax_ce")
    yaml_keys = sorted(set(registry.load(group, name)) - {"_target_"})
    message = str(info.value)  # one format with the command line's refusal (construct.refuse_unknown)
    assert message.startswith(f"unknown key(s) {group}.bogus")
    assert message.endswith(f"; allowed: {', '.join(yaml_keys)}")
    # the choice is named only where the group's choices take different keys (optim: adamw's b1, sgd's momentum)
    shared = all(set(registry.load(group, c)) == set(registry.load(group, name)) for c in registry.choices(group))
    assert (" for " not in message) == shared


# The keys the CLI consumes itself (construct.build's `read`); every other key of a shipped YAML is a constructor's.
READ_BY_THE_CLI = {"model": {"layer_normalizers"}, "trainer": {"vmap_seeds"}}


@pytest.mark.parametrize("group", sorted(registry.CONTRACTS))
def test_every_shipped_yaml_key_is_a_constructor_argument_or_read_by_the_cli(group):
    for name in registry.choices(group):
        raw = registry.load(group, name)
        target = registry.resolve_target(raw["_target_"], group)  # a subclass of the group's contract
        args, _ = construct.options_of(target)  # a constructor passing **kwargs on takes its base class's too
        unknown = set(raw) - {"_target_"} - READ_BY_THE_CLI.get(group, set()) - set(args)
        assert not unknown, f"configs/{group}/{name}.yaml: {sorted(unknown)}"


@pytest.mark.parametrize(
    "key, value",
    [
        ("task.vocab_size", 3),
        ("task.power_a", 0.0),
        ("task.num_kv_pairs", 100),
        ("model.positional", "alibi"),
        ("model.heads", 0),
        ("normalizer.block_size", 0),
        ("trainer.steps", 0),
        ("trainer.progress", "loud"),
        ("trainer.resume", "maybe"),
        ("optim.lr", 0.0),
        ("optim.b2", 1.0),
        ("optim.warmup_steps", -1),
        ("accelerator.dtype", "float16"),
        ("accelerator.devices", 0),
        ("accelerator.matmul_precision", "fast"),
    ],
)
def test_every_group_refuses_a_value_in_one_format_naming_the_full_key(key, value):
    cfg = compose_tiny(f"{key}={value}")
    with pytest.raises(ConfigError) as info:
        assemble(cfg, "softmax_ce")
    assert str(info.value).startswith(f"{key}={value!r} is invalid; allowed: "), str(info.value)


def test_the_task_receives_its_default_head_option():
    cfg = compose_tiny("task.default_head=scores_mse")
    task, _, _, _ = assemble(cfg, "softmax_ce")
    assert task.default_head == "scores_mse" and task.options["default_head"] == "scores_mse"


def test_an_unknown_key_gets_one_refusal_from_the_command_line_the_cli_build_and_the_library(capsys):
    with pytest.raises(ConfigError) as library:
        config.normalizer("softmax", num_heads=2, head_dim=8, prior="uniform")
    cfg = compose_tiny()
    with open_dict(cfg):
        cfg.normalizer.prior = "uniform"
    with pytest.raises(ConfigError) as built:
        assemble(cfg, "softmax_ce")
    with pytest.raises(SystemExit) as exited:
        composition.compose_or_exit(["model=tiny", "+normalizer.prior=uniform"])
    assert exited.value.code == 2
    line = capsys.readouterr().err.strip()
    allowed = ", ".join(sorted(set(registry.load("normalizer", "softmax")) - {"_target_"}))
    expected = (
        f"unknown key(s) normalizer.prior for normalizer=softmax (an option of normalizer=kl); allowed: {allowed}"
    )
    assert str(library.value) == str(built.value) == expected
    assert line == f"attnlab: error: {expected}"


def test_every_group_is_built_by_its_target_and_named_by_the_registry():
    for group in ("normalizer", "task", "head", "model", "optim", "trainer", "accelerator"):
        for name in registry.choices(group):
            cls = registry.resolve_target(registry.load(group, name)["_target_"], group)
            assert registry.name_of(group, cls) == (name if registry.varies(group) else registry.choices(group)[0])
    assert registry.name_of("normalizer", normalizers.KL) == "kl" and registry.name_of("normalizer", int) is None
    assert isinstance(assemble(compose_tiny("accelerator=cpu"), "softmax_ce")[1][0].body, model.Transformer)


SHARED = {"beta", "learnable", "per_head", "impl", "block_size", "softcap"}  # ScoreNormalizer.__init__'s options


class Alpha(normalizers.ScoreNormalizer):
    def __init__(self, *, alpha=1.0, **shared):
        self.alpha = alpha
        super().__init__(**shared)

    def normalize(self, z_BNTS, m_B1TS):
        return normalizers.masked_softmax(self.alpha * z_BNTS, m_B1TS), z_BNTS, {}


class Open:
    def __init__(self, *, alpha=1.0, **anything):
        self.alpha = alpha


@pytest.mark.parametrize(
    "cls, own, open_ended",
    [(normalizers.Sigmoid, {"bias"}, False), (normalizers.ReLU, set(), False), (Alpha, {"alpha"}, False)],
)
def test_a_constructor_that_passes_its_keywords_on_takes_its_base_classs_options(cls, own, open_ended):
    accepted, takes_any = construct.options_of(cls, given=("num_heads", "head_dim", "rngs"))
    assert set(accepted) == own | SHARED and takes_any is open_ended


def test_keywords_passed_to_no_attnlab_class_leave_a_constructor_open_ended():
    assert construct.options_of(Open) == (["alpha"], True)
    assert construct.options_of(normalizers.SSMax, given=("num_heads", "head_dim", "rngs"))[0] == [
        "s",
        "learnable",
        "bias",
        "beta",
        "impl",
        "block_size",
        "softcap",
    ]
