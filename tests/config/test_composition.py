"""A single run's bad values refused as its config is composed, before jax loads (composition.refuse_bad_values):
each component's checks declared once without jax (attnlab.options), read there and called by its constructor."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab import config, exits, options
from attnlab.checks import ConfigError
from attnlab.config import composition, registry

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "capped"

# (command line, its refusal: the constructor's words, as before the checks were declared in attnlab.options)
REFUSED = [
    (
        ["normalizer=entmax", "normalizer.alpha=0.5"],
        "normalizer.alpha=0.5 is invalid; allowed: a finite number > 1.0 and <= 100.0",
    ),
    (["optim.b2=1.0"], "optim.b2=1.0 is invalid; allowed: a finite number >= 0.0 and < 1.0"),
    (["trainer.steps=abc"], "trainer.steps='abc' is invalid; allowed: an integer >= 1 and <= 2147483647"),
    (["task.num_kv_pairs=100"], "task.num_kv_pairs=100 is invalid; allowed: an integer >= 1 and <= 16"),
    (["model.heads=0"], "model.heads=0 is invalid; allowed: an integer >= 1"),
    (["model.positional=alibi"], "model.positional='alibi' is invalid; allowed: learned, sinusoidal, rope, none"),
    (["seed=-1"], "seed=-1 is invalid; allowed: an integer in [0, 2^31 - trainer.vmap_seeds)"),
]


@pytest.mark.parametrize("argv, said", REFUSED, ids=[" ".join(argv) for argv, _ in REFUSED])
def test_a_bad_value_is_refused_in_one_line_before_jax_loads(tmp_path, argv, said):
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "attnlab", *argv, "accelerator=cpu"],
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stderr.splitlines()
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}
    assert proc.returncode == exits.REFUSED, proc.stderr[-2000:]
    assert [line for line in lines if not line.startswith("import time:")] == [f"attnlab: error: {said}"]
    assert "attnlab.cli" in imported  # the entry point ran: the refusal is the command's own
    assert not {name for name in imported if name.split(".")[0] in ("jax", "flax")}
    assert not list(tmp_path.iterdir())  # refused before Hydra made a run directory


def test_every_attnlab_component_declares_checks_that_read_its_yaml():
    """Every choice's `_target_` has its checks in attnlab.options, each reading only keys of its YAML (a check
    reading a key the YAML lacks would silently leave the value to the constructor), and the YAML's defaults pass."""
    for group in registry.groups():
        for name in registry.choices(group):
            values = registry.load(group, name)
            declared = options.DECLARED[group][values["_target_"]]
            read = {key for check in declared for key in inspect.signature(check).parameters}
            assert read <= set(values), (group, name, sorted(read - set(values)))
            options.check(group, values)


@pytest.fixture
def user_project(monkeypatch):
    """examples/capped importable, as `pip install -e examples/capped` makes it."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield EXAMPLE / "configs"
    registry.use()


def test_a_users_component_without_a_declaration_is_checked_by_its_constructor(user_project):
    """examples/capped's normalizer declares nothing in attnlab.options: composing passes its bad cap on, and its
    constructor refuses it when the run builds it, as before."""
    composition.compose_or_exit(["--config-dir", str(user_project), "normalizer=capped", "normalizer.cap=-1"])
    with pytest.raises(ConfigError, match=r"^normalizer\.cap=-1 is invalid; allowed: a finite number > 0\.0$"):
        config.normalizer("capped", num_heads=2, head_dim=4, cap=-1)
