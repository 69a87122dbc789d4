"""Components written to the contract of the release before (tests/config/previous_release: a normalizer, a task
whose constructor takes no `test_lengths` and does not call Task.__init__, a head, their YAMLs) pass attnlab-check,
train and sweep, with a DeprecationWarning where the contract changed since (README, Contract changes)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml
from cli_helpers import TINY, tiny_task, train_in_process

from attnlab.config import check, construct, registry

PACKAGE = Path(__file__).parent / "previous_release"
CONFIGS = PACKAGE / "configs"
CHANGED = r"task FirstToken: its __init__ does not take test_lengths, which the config layer sets on the built task"


@pytest.fixture
def last_release(monkeypatch):
    monkeypatch.syspath_prepend(str(PACKAGE))
    yield CONFIGS
    registry.use()


def test_the_task_gets_test_lengths_applied_with_a_warning_naming_the_new_way(last_release):
    registry.use([str(last_release)])
    node = {**registry.load("task", "first_token"), "test_lengths": [8]}
    with pytest.warns(DeprecationWarning, match=CHANGED + r".*super\(\).__init__\(\*\*shared\)"):
        task = construct.build("task", node)
    assert task.test_lengths == [8] and task.seq_len == 8
    with warnings.catch_warnings():  # a task of today's contract takes it itself
        warnings.simplefilter("error", DeprecationWarning)
        tiny = dict(o.split("=", 1) for o in tiny_task("max_retrieval"))
        options = {k.removeprefix("task."): yaml.safe_load(v) for k, v in tiny.items()}
        construct.build("task", {**registry.load("task", "max_retrieval"), **options})


def test_they_pass_attnlab_check(last_release, capsys):
    with pytest.warns(DeprecationWarning, match=CHANGED):
        check.main(["--config-dir", str(last_release), "normalizer=halved", "task=first_token", "head=plain_ce"])
    out = capsys.readouterr().out
    for passed in ("normalizer=halved", "task=first_token", "head=plain_ce"):
        assert f"attnlab-check: {passed} passed its contract" in out, out


def test_they_train_and_sweep_against_softmax(last_release, tmp_path):
    proc = train_in_process(
        "-m",
        "--config-dir",
        str(last_release),
        "normalizer=halved,softmax",
        "task=first_token",
        "head=plain_ce",
        *TINY,
        f"hydra.sweep.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert "attnlab: warning: " + CHANGED.replace("\\", "") in proc.stderr, proc.stderr[-2000:]
    runs = sorted(p.name for p in tmp_path.iterdir() if (p / "metrics.json").is_file())
    assert runs == ["0_normalizer=halved", "1_normalizer=softmax"]
    for run in runs:
        record = json.loads((tmp_path / run / "metrics.json").read_text())
        assert record["status"] == "completed" and record["steps"] == 4, record.get("error")
