"""Every suggestion a refusal makes is one that works: each key it names exists in the config its fix composes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import train_in_process
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from attnlab.config import mistakes, registry

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import validation_table  # noqa: E402

GROUPS = "|".join(mistakes.groups())
OVERRIDE = re.compile(rf"(?<![\w./$])((?:{GROUPS}|seed|compile_cache)(?:\.\w+)*)=([^\s,;)']+)")
DOTTED = re.compile(rf"(?<![\w./$])((?:{GROUPS})\.\w+)")
NAMES = {*mistakes.groups(), *mistakes.top_keys(), *(n for g in mistakes.groups() for n in registry.choices(g))}
SNAKE = re.compile(r"(?<![\w./$'])([a-z]+(?:_[a-z0-9]+)+)(?![\w/'])")


def suggestions(line: str) -> tuple[dict[str, str], list[list[str]], set[str]]:
    """(overrides the line gives as its fix, alternatives a did-you-mean offers, keys the line refuses)."""
    overrides = {k: v for k, v in OVERRIDE.findall(line) if not v.startswith("<") and not k.startswith("hydra")}
    meant = re.search(r"did you mean ([^?]+)\?", line)
    alternatives = [[k] for k in meant.group(1).split(" or ")] if meant else []
    refused = set(re.findall(r"([\w.+~]+) is not a key of the config", line))
    refused |= set(re.findall(r"(\w+)=\S+ unknown", line))  # a choice that does not exist
    listed = re.search(r"unknown key\(s\) ([\w.,+~ ]+?)(?: for \w+=\w+)?(?:;| \()", line)
    refused |= {k.strip() for k in listed.group(1).split(",")} if listed else set()
    refused = {k.lstrip("+~") for k in refused}
    return {k: v for k, v in overrides.items() if k not in refused}, alternatives, refused


def named_keys(line: str) -> set[str]:
    """The config keys a line names: dotted keys, and the leaves of an `allowed in G:` or `unknown key(s) G.x;
    allowed:` list."""
    keys = set(DOTTED.findall(line))
    for group, leaves in re.findall(r"allowed in (\w+): ([\w, ]+)", line):
        keys |= {f"{group}.{leaf.strip()}" for leaf in leaves.split(",")}
    m = re.search(r"unknown key\(s\) (\w+)\.[\w, .]+(?: for \w+=\w+)?(?: \([^)]*\))?; allowed: ([\w, ]+)", line)
    if m:
        keys |= {f"{m.group(1)}.{leaf.strip()}" for leaf in m.group(2).split(",")}
    return keys


def composed(overrides: dict[str, str]):
    with initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=[f"{k}={v}" for k, v in overrides.items()])


def has(cfg, key: str) -> bool:
    return key in mistakes.groups() or OmegaConf.select(cfg, key, default="<absent>") != "<absent>"


def check_line(case: list[str], line: str) -> list[str]:
    """What is wrong with the suggestions of `line`, the refusal of `case`; empty when each one works."""
    base = dict(
        o.lstrip("+").split("=", 1)
        for o in validation_table.command_line(case, Path("/unused"))
        if not o.startswith("hydra.")
    )
    fix, alternatives, refused = suggestions(line)
    prose = re.sub(r"allowed( in \w+)?: [^;]*", "", line)  # lists of a group's options name leaves
    wrong = [f"{w!r} reads as a key without its group" for w in SNAKE.findall(prose) if w not in NAMES]
    wrong += [f"{k}= is not a key" for k in re.findall(r"(?<![\w./$])(\w+)=", line) if k not in NAMES]
    trials = [({**{k: v for k, v in base.items() if k not in refused}, **fix}, named_keys(line) - refused)]
    for [key] in alternatives:  # the refused key renamed to the one suggested, with the value given
        renamed = {(key if k in refused else k): v for k, v in base.items()}
        trials.append((renamed, {key}))
    for overrides, keys in trials:
        try:
            cfg = composed(overrides)
        except (HydraException, OmegaConfBaseException) as exc:
            wrong.append(f"{sorted(overrides.items())} does not compose: {str(exc).splitlines()[0]}")
            continue
        wrong += [
            f"{k} is not in the composed config of {sorted(overrides.items())}" for k in sorted(keys) if not has(cfg, k)
        ]
    return wrong


@pytest.mark.parametrize(
    "case, needle",
    [
        (["normalizer=softmax", "normalizer.prior=recency"], "normalizer.prior is an option of normalizer=kl"),
        (["normalizer=linear", "normalizer.slope=0.2"], "e.g. normalizer=kl normalizer.slope=0.2"),
        (["trainer.stepz=3"], "did you mean trainer.steps?"),
        (["model.causal=false"], "model.causal=true or model.causal=null"),
        (["task=lm", "task.path={short_text}", "task.seq_len=64"], "task.seq_len=51 or smaller"),
        (
            ["task=lm", "task.path={short_text}", "task.val_fraction=0.5", "task.test_fraction=0.5"],
            "smaller task.val_fraction and task.test_fraction",
        ),
    ],
)
def test_a_refusal_suggests_keys_of_the_config_it_composes(tmp_path, case, needle):
    validation_table.cases(tmp_path)  # writes the short text
    case = [o.format(short_text=tmp_path / "short.txt") for o in case]
    proc = train_in_process(*validation_table.command_line(case, tmp_path / "run"), cwd=tmp_path, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("attnlab: error:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    line = lines[0]
    assert needle in line, line
    assert check_line(case, line) == [], line


def test_the_shortest_seq_len_a_short_corpus_suggests_builds_the_task(tmp_path):
    from attnlab.checks import ConfigError
    from attnlab.tasks.lm import LanguageModel as LM

    text = tmp_path / "short.txt"  # random letters: no window of one split repeats one of another
    text.write_bytes(np.random.default_rng(0).integers(97, 123, 520, dtype=np.uint8).tobytes())
    with pytest.raises(ConfigError) as refused:
        LM(seq_len=64, path=str(text))
    longest = int(re.search(r"task\.seq_len=(\d+) or smaller", str(refused.value)).group(1))
    assert LM(seq_len=longest, path=str(text)).seq_len == longest
    with pytest.raises(ConfigError):
        LM(seq_len=longest + 1, path=str(text))


def test_the_checker_catches_a_suggestion_that_does_not_work():
    assert check_line(
        ["normalizer=softmax", "normalizer.prior=recency"],
        "normalizer.prior is not a key of the config (did you mean normalizer.prior or normalizer.power?)",
    )
    assert check_line(["task=lm"], "the val split is short; use a larger val_fraction or a smaller seq_len")
    assert check_line(["model.causal=false"], "use model.causal=true") == []


@pytest.mark.slow  # the whole table: ~60 cases through the entry point, ~40 s
def test_every_suggestion_of_the_validation_table_composes():
    proc = subprocess.run(
        [sys.executable, str(Path(validation_table.__file__))],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"},
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r.split(" | ") for r in proc.stdout.splitlines() if r.startswith("| `")]
    assert len(rows) >= 50, proc.stdout[-2000:]
    wrong = {}
    for case, code, line, _ in rows:
        case, line = case.strip("|` ").split(" "), line.replace("∣", "|")
        assert code == "2", (case, line)
        problems = check_line(case, line)
        if problems:
            wrong[" ".join(case)] = (line, problems)
    assert not wrong, wrong
