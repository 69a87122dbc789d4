"""A user's own components through the search path: examples/capped's normalizer, task and head, composed from
its config directory the way `--config-dir` adds it, examples/cosine's general-contract normalizer (q and k
themselves) checked, trained and swept, and the refusals of a `_target_` that is no component."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from cli_helpers import TINY, tiny_task, train_in_process
from flax import nnx
from hydra import compose, initialize_config_dir

from attnlab import config
from attnlab import normalizers as nz
from attnlab.checks import ConfigError
from attnlab.config import check, composition, construct, registry
from attnlab.config.assembly import assemble
from attnlab.testing import ContractViolation, check_normalizer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "capped"
USER_CONFIGS = EXAMPLE / "configs"
COSINE = Path(__file__).resolve().parents[2] / "examples" / "cosine"


@pytest.fixture
def user_project(monkeypatch):
    """examples/capped importable and its configs/ on the search path, as `--config-dir` puts it there."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    registry.use([str(USER_CONFIGS)])
    yield USER_CONFIGS
    registry.use()


def test_a_user_config_dir_adds_a_choice_to_every_group_it_names(user_project):
    assert "capped" in registry.choices("normalizer") and "softmax" in registry.choices("normalizer")
    assert "majority" in registry.choices("task") and "smoothed_ce" in registry.choices("head")
    assert registry.load("normalizer", "capped")["_target_"] == "capped.CappedSoftmax"
    registry.use()
    assert "capped" not in registry.choices("normalizer")  # nothing is left behind for the next lookup


def test_the_did_you_mean_and_the_allowed_list_see_the_users_choices(user_project, capsys):
    with pytest.raises(SystemExit) as refused:
        composition.compose_or_exit(["--config-dir", str(user_project), "normalizer=capeed"])
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnlab: error: normalizer=capeed unknown (did you mean capped?); allowed: capped, ")


def test_a_missing_config_dir_is_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as refused:
        composition.compose_or_exit(["--config-dir", str(tmp_path / "nowhere"), "normalizer=softmax"])
    assert refused.value.code == 2
    assert (
        capsys.readouterr().err.strip() == f"attnlab: error: --config-dir '{tmp_path / 'nowhere'}': no such directory"
    )


def test_capped_softmax_matches_its_float64_reference_and_softmax_without_a_cap(user_project):
    rng = np.random.default_rng(0)
    q_BNTH, k_BNSH = (rng.normal(size=(2, 3, 6, 5)).astype(np.float32) for _ in range(2))
    valid_BS = np.ones((2, 6), bool)
    valid_BS[1, 4:] = False
    mask = nz.Mask(key_valid_BS=valid_BS, causal=True)
    capped = config.normalizer("capped", num_heads=3, head_dim=5, cap=0.7, beta=2.0)
    admissible_BTS = np.asarray(mask.matrix_B1TS(6, 6))[:, 0]
    reference_BNTS = capped.reference(q_BNTH, k_BNSH, admissible_BTS)[0]
    np.testing.assert_allclose(capped.weights(q_BNTH, k_BNSH, mask), reference_BNTS, atol=2e-6)
    # |logit| < c bounds a row's largest weight by e^c / (e^c + (n − 1)·e^−c) over its n keys; softmax exceeds it
    n_B1T1 = admissible_BTS.sum(-1)[:, None, :, None]
    bound_B1T1 = np.exp(0.7) / (np.exp(0.7) + (n_B1T1 - 1) * np.exp(-0.7))
    assert (reference_BNTS.max(-1, keepdims=True) <= bound_B1T1 + 1e-12).all()
    softmax = config.normalizer("softmax", num_heads=3, head_dim=5, beta=2.0)
    softmax_BNTS = np.asarray(softmax.weights(q_BNTH, k_BNSH, mask))
    assert (softmax_BNTS.max(-1, keepdims=True) > bound_B1T1 + 0.05).any()
    uncapped = config.normalizer("capped", num_heads=3, head_dim=5, cap=1e6, beta=2.0)
    np.testing.assert_allclose(uncapped.weights(q_BNTH, k_BNSH, mask), softmax_BNTS, atol=1e-6)


def test_model_layer_normalizers_takes_a_users_normalizer(user_project):
    with initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                "model=tiny",
                "model.layers=2",
                "model.layer_normalizers=[capped,softmax]",
                *tiny_task("mqar"),
                f"hydra.searchpath=[file://{user_project}]",
            ],
        )
    body = assemble(cfg, "softmax_ce", "softmax")[1][0].body
    kinds = [type(block.attn.normalizer).__name__ for block in body.blocks]
    assert kinds == ["CappedSoftmax", "Softmax"]


def test_a_users_task_and_head_are_built_and_checked_like_attnlabs(user_project):
    task = config.task("majority", n_train=64, n_val=16, n_test=16)
    for split in task.splits.values():  # the label is the majority of the bits, computed here independently
        np.testing.assert_array_equal(split.targets, (split.inputs.sum(-1) > task.seq_len / 2).astype(np.int32))
    assert config.head_kind("smoothed_ce") == "classification"
    with pytest.raises(ConfigError, match=r"^head=smoothed_ce serves classification, but task=t is regression; "):
        config.check_head_serves("smoothed_ce", "regression", "task=t")
    with pytest.raises(ConfigError, match=r"^task\.length=4 is invalid; allowed: an odd integer"):
        config.task("majority", length=4)


@pytest.fixture
def cosine_project(monkeypatch):
    """examples/cosine importable, as `pip install -e examples/cosine` makes it."""
    monkeypatch.syspath_prepend(str(COSINE))
    yield COSINE / "configs"
    registry.use()


def test_a_general_contract_normalizer_passes_attnlab_check(cosine_project, capsys):
    try:
        check.main(["--config-dir", str(cosine_project), "normalizer=cosine"])
    finally:
        registry.use()
    assert capsys.readouterr().out.strip() == (
        "attnlab-check: normalizer=cosine passed its contract (attnlab.testing.check_normalizer)"
    )


def test_cosine_attention_overflowing_without_its_max_is_named_at_the_extremes(cosine_project):
    """Invariant to the scale of q and k, cosine attention meets large logits only with τ at the top of its range:
    e^x without the row's max taken off overflows there."""
    from cosine import CosineAttention

    class Naive(CosineAttention):
        def weights(self, q_BNTH, k_BNSH, mask):
            e = jnp.exp(self._logits(q_BNTH, k_BNSH)) * mask.matrix_B1TS(q_BNTH.shape[2], k_BNSH.shape[2])
            return e / jnp.maximum(e.sum(-1, keepdims=True), 1e-30)

    with pytest.raises(ContractViolation, match=r"^normalizer=naive: extremes: the weights must stay finite with "):
        check_normalizer(Naive, name="naive")


def test_a_general_contract_normalizer_trains_and_sweeps_against_softmax(cosine_project, tmp_path):
    train_in_process(
        "-m",
        "--config-dir",
        str(cosine_project),
        "normalizer=cosine,softmax",
        "task=mqar",
        *TINY,
        *("task.seq_len=16", "task.vocab_size=16", "task.num_kv_pairs=2", "task.n_train=200"),
        *("task.n_val=40", "task.n_test=40"),
        f"hydra.sweep.dir={tmp_path}",
        cwd=tmp_path,
    )
    runs = sorted(p.name for p in tmp_path.iterdir() if (p / "metrics.json").is_file())
    assert runs == ["0_normalizer=cosine", "1_normalizer=softmax"]
    cosine = json.loads((tmp_path / runs[0] / "metrics.json").read_text())
    assert cosine["status"] == "completed" and cosine["steps"] == 4, cosine.get("error")


def test_a_target_that_is_no_component_is_refused_before_it_is_called(monkeypatch):
    called = []
    monkeypatch.setattr(os, "system", lambda *a: called.append(a))
    with pytest.raises(ConfigError, match=r"^normalizer _target_ 'os.system' refused \(a function\): a normalizer "):
        construct.build("normalizer", {"_target_": "os.system", "command": "touch /tmp/x"}, deferred=("num_heads",))
    with pytest.raises(ConfigError, match=r"^task _target_ 'attnlab.normalizers.Softmax' refused \(class Softmax\)"):
        construct.build("task", {"_target_": "attnlab.normalizers.Softmax"})
    assert called == []


def test_a_target_whose_module_fails_to_import_names_the_module_and_its_error(monkeypatch, tmp_path):
    (tmp_path / "needs_a_gpu.py").write_text("raise RuntimeError('no CUDA device\\nfound')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as refused:
        construct.build("normalizer", {"_target_": "needs_a_gpu.Fast"}, deferred=("num_heads",))
    assert str(refused.value) == (
        "normalizer _target_ 'needs_a_gpu.Fast': module 'needs_a_gpu' failed to import: "
        "RuntimeError: no CUDA device found"
    )


def test_a_normalizer_no_yaml_names_is_named_by_its_class():
    made = nz.Softmax(num_heads=2, head_dim=4, rngs=nnx.Rngs(0), impl="cudnn")
    with pytest.raises(ConfigError, match=r"^normalizer\.impl=cudnn cannot run for Softmax: platform cpu"):
        made.choose_backend(8, 8, nz.Mask(causal=True), np.float32, nz.base.Workload(1, 2))
    built = config.normalizer("softmax", num_heads=2, head_dim=4, impl="cudnn")
    with pytest.raises(ConfigError, match=r"^normalizer\.impl=cudnn cannot run for softmax: platform cpu"):
        built.choose_backend(8, 8, nz.Mask(causal=True), np.float32, nz.base.Workload(1, 2))


def test_a_user_yaml_that_attnlabs_own_would_shadow_is_refused_where_chosen_and_warned_of_elsewhere(
    tmp_path, monkeypatch, capsys
):
    # Hydra puts --config-dir and hydra.searchpath after its primary config directory, attnlab's configs/, so a
    # user's normalizer/softmax.yaml would silently build attnlab's softmax.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine" / "normalizer").mkdir(parents=True)
    (tmp_path / "mine" / "normalizer" / "softmax.yaml").write_text("_target_: attnlab.normalizers.ReLU\n")
    said = (
        "mine/normalizer/softmax.yaml: attnlab has its own normalizer=softmax, which Hydra reads first, so this "
        "file would never be used; give yours another name (e.g. normalizer/softmax_mine.yaml)"
    )
    searchpath = f"hydra.searchpath=[file://{tmp_path / 'mine'}]"
    chosen = [["--config-dir", "mine"], [searchpath], ["-m", "--config-dir", "mine", "normalizer=relu,softmax"]]
    for argv in chosen:  # softmax by default, or in a sweep
        with pytest.raises(SystemExit) as refused:
            composition.compose_or_exit(argv)
        assert refused.value.code == 2 and capsys.readouterr().err == f"attnlab: error: {said}\n", argv
    composition.compose_or_exit(["--config-dir", "mine", "normalizer=relu"])  # never read: a warning, and it runs
    unread = said.replace("would never be used", "is not used (this command does not choose it)")
    assert capsys.readouterr().err == f"attnlab: warning: {unread}\n"
    with pytest.raises(ConfigError, match=r"^hydra\.searchpath entry 'file:///nowhere/at/all': no such directory$"):
        registry.use(searchpath=["file:///nowhere/at/all"])
    registry.use()


def test_a_users_yaml_with_a_key_too_many_or_too_few_is_refused_naming_that_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mycfg" / "normalizer").mkdir(parents=True)
    options = "_target_: attnlab.normalizers.ReLU\ndefaults: [_scored_, _self_]\n"  # attnlab's shared options
    (tmp_path / "mycfg" / "normalizer" / "extra.yaml").write_text(options + "bogus: 1\n")
    (tmp_path / "mycfg" / "normalizer" / "short.yaml").write_text(options.replace("[_scored_, _self_]", "[_self_]"))
    config.use_config_dirs("mycfg")
    with pytest.raises(ConfigError) as refused:
        config.normalizer("extra", num_heads=2, head_dim=4)
    assert str(refused.value) == (
        "mycfg/normalizer/extra.yaml sets bogus, which ReLU.__init__ does not take; "
        "allowed: beta, block_size, impl, learnable, per_head, softcap"
    )
    with pytest.raises(ConfigError) as refused:
        config.normalizer("short", num_heads=2, head_dim=4)
    assert str(refused.value) == (
        "ReLU.__init__ takes beta, learnable, per_head, impl, block_size, softcap but mycfg/normalizer/short.yaml "
        "has no such key; every option needs a YAML line "
        "(its default)"
    )
    with pytest.raises(ConfigError, match=r"^--config-dir 'gone': no such directory$"):
        config.use_config_dirs("gone")
    registry.use()


def test_a_task_yaml_naming_a_normalizer_is_refused_by_the_cli_in_one_line(tmp_path):
    (tmp_path / "mycfg" / "task").mkdir(parents=True)
    (tmp_path / "mycfg" / "task" / "wrong.yaml").write_text("_target_: attnlab.normalizers.ReLU\n")
    proc = train_in_process("--config-dir", "mycfg", "task=wrong", "trainer.steps=1", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "attnlab: error: task _target_ 'attnlab.normalizers.ReLU' refused (class ReLU): a task must be a class "
        "subclassing attnlab.tasks.base.Task"
    )
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*.json"))


def test_a_broken_user_yaml_is_one_line_where_chosen_and_no_obstacle_elsewhere(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mycfg" / "normalizer").mkdir(parents=True)
    (tmp_path / "mycfg" / "normalizer" / "syntax.yaml").write_text("_target_: x.Y\npower: [2.0\nbeta: null\n")
    (tmp_path / "mycfg" / "normalizer" / "untargeted.yaml").write_text("power: 2.0\n")
    with pytest.raises(SystemExit) as refused:
        composition.compose_or_exit(["--config-dir", "mycfg", "normalizer=syntax"])
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "syntax.yaml" in err and "expected ',' or ']'" in err, err
    composition.compose_or_exit(["--config-dir", "mycfg", "normalizer=kl"])  # the other choices are unaffected
    assert "kl" in dict(registry.built("normalizer")) and "syntax" not in dict(registry.built("normalizer"))
    with pytest.raises(ConfigError) as refused:
        config.normalizer("untargeted", num_heads=2, head_dim=4)
    assert str(refused.value) == (
        "mycfg/normalizer/untargeted.yaml has no _target_; give the normalizer's class as module.Class"
    )
    registry.use()


def test_a_contracts_base_class_is_refused_as_a_target():
    for group, target in (
        ("normalizer", "attnlab.normalizers.ScoreNormalizer"),
        ("normalizer", "attnlab.normalizers.Normalizer"),
        ("head", "attnlab.heads.base.Head"),
        ("task", "attnlab.tasks.base.Task"),
    ):
        with pytest.raises(ConfigError, match=rf"^{group} _target_ '{target}' refused \(class \w+ is a base to "):
            registry.resolve_target(target, group)
    # groups whose contract is the one class they build accept it
    assert registry.resolve_target("attnlab.model.Transformer", "model").__name__ == "Transformer"


def test_a_target_whose_package_is_not_importable_says_how_to_make_it_so():
    # a console script does not put the working directory on sys.path: a user's package must be installed
    with pytest.raises(ConfigError) as refused:
        registry.resolve_target("not_installed_pkg.norm.Mine", "normalizer")
    assert str(refused.value) == (
        "normalizer _target_ 'not_installed_pkg.norm.Mine': module 'not_installed_pkg.norm' failed to import: "
        "ModuleNotFoundError: No module named 'not_installed_pkg' (install the project that holds not_installed_pkg "
        "with `pip install -e <its directory>`, or put its directory on PYTHONPATH)"
    )


def test_a_key_a_users_preset_sets_wrongly_is_refused_naming_the_preset(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mycfg" / "experiment").mkdir(parents=True)
    (tmp_path / "mycfg" / "experiment" / "mine.yaml").write_text("# @package _global_\ntrainer:\n  stepz: 5\n")
    for extra, from_preset in (([], True), (["trainer.stepz=3"], False)):  # the second names the key itself
        with pytest.raises(SystemExit) as refused:
            composition.compose_or_exit(["-m", "--config-dir", "mycfg", "experiment=mine", *extra])
        assert refused.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("attnlab: error: unknown key(s) trainer.stepz (did you mean trainer.steps?)"), err
        assert err.endswith(" (set by experiment=mine: mycfg/experiment/mine.yaml)") == from_preset, err
    registry.use()
