"""Command-line mistakes answered in one line with the fix (`did you mean trainer.steps?`), before Hydra runs.

Hydra's own answers lead to a second mistake (`steps=100` → "use +steps=100" → unknown key) or are
parser dumps; these rewrite them. Each function returns the one-line message, or None when it has no
better answer than Hydra's.
"""

from __future__ import annotations

import difflib
import re

from hydra.core.override_parser.overrides_parser import OverridesParser

from attnlab.config import registry
from attnlab.sweep.signals import SWEEP_FLAGS

# Hydra's own flags (hydra/_internal/utils.py get_args_parser); anything else starting with '-' is a mistake.
HYDRA_FLAGS = {
    "-h",
    "--help",
    "-hp",
    "--hydra-help",
    "--version",
    "-c",
    "--cfg",
    "--resolve",
    "-p",
    "--package",
    "-r",
    "--run",
    *SWEEP_FLAGS,
    "-sc",
    "--shell-completion",
    "-cp",
    "--config-path",
    "-cn",
    "--config-name",
    "-cd",
    "--config-dir",
    "--experimental-rerun",
    "-i",
    "--info",
}
# Names other frameworks use for a key or a choice here.
SYNONYMS = {
    "learning_rate": "optim.lr",
    "epochs": "trainer.steps",
    "max_steps": "trainer.steps",
    "num_steps": "trainer.steps",
    "iterations": "trainer.steps",
    "batch": "trainer.batch_size",
    "bs": "trainer.batch_size",
    "device": "accelerator",
    "cuda": "gpu",
    "attention": "normalizer",
}


def groups() -> list[str]:
    return registry.groups()


def top_keys() -> set[str]:
    """The top-level keys of configs/train.yaml as Hydra composes it (hydra included, the groups not)."""
    return registry.top_keys()


def _options(group: str, name: str) -> set[str]:
    return {k for k in registry.load(group, name) if not k.startswith("_") and k != "defaults"}


def chosen(overrides: list[str] | None) -> dict[str, str | None]:
    """The choice of each group a command line composes, as Hydra composes them (a preset's included); a choice
    that does not exist is kept as written (the message being worded is about it)."""
    picks, unknown = [], {}
    for o in overrides or []:
        key, _, value = o.partition("=")
        key = key.lstrip("+~")
        if key not in {*groups(), registry.PRESETS} or not value or "," in value:
            continue
        if value in registry.choices(key):
            picks.append(f"{key}={value}")
        else:
            unknown[key] = value
    composed = registry.choices_composed(tuple(picks))
    return {g: unknown.get(g, composed.get(g)) for g in groups()}


def known_keys(overrides: list[str] | None = None) -> list[str]:
    """Every dotted key a command line may set: top-level keys, groups, and each option of any choice;
    given the command line's overrides, only the options of the choices it composes."""
    keys = (top_keys() - {"hydra"}) | set(groups())
    picked = chosen(overrides) if overrides is not None else {}
    for group in groups():
        names = [picked[group]] if picked.get(group) in registry.choices(group) else registry.choices(group)
        if group in picked and picked[group] is None:
            names = []  # head: null, the task's default head: its options are not known before the task
        for name in names:
            keys |= {f"{group}.{k}" for k in _options(group, name)}
    return sorted(keys)


def owners(key: str, overrides: list[str] | None) -> list[str]:
    """The other choices of `key`'s group that have it as an option (normalizer.prior → [kl])."""
    group, _, leaf = key.lstrip("+~").partition(".")
    if group not in groups() or not leaf:
        return []
    mine = chosen(overrides).get(group)
    return [n for n in registry.choices(group) if n != mine and leaf in _options(group, n)]


def did_you_mean(key: str, overrides: list[str] | None = None) -> str:
    """' (did you mean trainer.steps?)' for a key that exists elsewhere or nearly; '' when nothing is close.
    Given the command line's overrides, only keys its composed config has are suggested."""
    key = key.lstrip("+~")
    keys = known_keys(overrides)
    leaf = key.rsplit(".", 1)[-1]
    if SYNONYMS.get(leaf) in keys:
        return f" (did you mean {SYNONYMS[leaf]}?)"
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf and k != key]
    depth = [k for k in keys if k.count(".") == key.count(".")]  # a key's neighbours, not its group
    near = same_leaf or difflib.get_close_matches(key, depth, n=3, cutoff=0.75)
    if not near:  # a misspelt leaf under a right or wrong group: compare leaves
        leaves = {k.rsplit(".", 1)[-1]: k for k in keys if "." in k}
        near = [leaves[m] for m in difflib.get_close_matches(leaf, list(leaves), n=3, cutoff=0.8)]
    return f" (did you mean {' or '.join(near[:3])}?)" if near else ""


def check_argv(argv: list[str]) -> str | None:
    """Mistakes visible in the words themselves: `--key value`, a space after a comma, a word without '='."""
    for i, arg in enumerate(argv):
        name = arg.split("=", 1)[0]
        if arg.startswith("-") and name not in HYDRA_FLAGS:
            key = name.lstrip("-")
            value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "<value>")
            return f"{arg} is not an option; overrides are key=value, e.g. {key}={value}"
        if arg.startswith("-") or (i > 0 and argv[i - 1] in HYDRA_FLAGS - set(SWEEP_FLAGS) - {"--resolve"}):
            continue  # a Hydra flag or its value (--cfg job, -cn train)
        if arg.endswith(",") and i + 1 < len(argv):
            return f"a space after the comma in {arg} {argv[i + 1]}; remove it: {arg}{argv[i + 1]}"
        if arg.startswith(",") and i > 0:
            return f"a space before the comma in {argv[i - 1]} {arg}; remove it: {argv[i - 1]}{arg}"
        if "=" not in arg and not arg.startswith("~"):
            owners = [g for g in groups() if arg in registry.choices(g)]
            nxt = argv[i + 1] if i + 1 < len(argv) and "=" not in argv[i + 1] else None
            if ":" in arg:  # YAML's `key: value` habit
                key, _, value = arg.partition(":")
                example = f"{key.strip()}={value.strip() or nxt or '<value>'}"
            elif arg in known_keys() and nxt:  # `normalizer softmax`
                example = f"{arg}={nxt}"
            else:
                example = f"{owners[0]}={arg}" if owners else "normalizer=softmax"
            return f"{arg!r} is not an override; overrides are key=value, e.g. {example}"
    return None


def check_sweep(overrides: list[str], multirun: bool) -> str | None:
    """Several values for a key (a,b / range / glob) without -m: Hydra's six-line 'Ambiguous value'."""
    if multirun:
        return None
    swept = [o.input_line for o in OverridesParser.create().parse_overrides(overrides) if o.is_sweep_override()]
    if not swept:
        return None
    return (
        f"several values need -m for a sweep: attnlab-train -m {' '.join(swept)} ...; "
        f"for a list value use brackets, e.g. model.layer_normalizers=[softmax,linear]"
    )


def explain(message: str, overrides: list[str] | None = None) -> str | None:
    """Hydra's composition errors rewritten: unknown key or choice, with what the user probably meant.
    `overrides`: the command line that failed, whose choices decide which options exist."""
    m = re.search(r"Could not override '([^']+)'", message)
    if m:
        key = m.group(1)
        group = key.split(".", 1)[0]
        elsewhere = owners(key, overrides)
        if elsewhere:
            mine = chosen(overrides).get(group)
            value = next(
                (o.partition("=")[2] for o in overrides or [] if o.split("=", 1)[0].lstrip("+~") == key), "..."
            )
            return (
                f"{key} is an option of {' and '.join(f'{group}={n}' for n in elsewhere)}, not of {group}={mine}; "
                f"e.g. {group}={elsewhere[0]} {key}={value}"
            )
        allowed = [k for k in known_keys(overrides) if k.startswith(group + ".")] if "." in key else []
        hint = did_you_mean(key, overrides)
        tail = f"; allowed in {group}: {', '.join(k.split('.', 1)[1] for k in allowed)}" if allowed and not hint else ""
        return f"{key} is not a key of the config{hint}{tail}"
    m = re.search(r"Could not find '([^']+)/([^'/]+)'", message)
    if m:
        return unknown_choice(*m.groups())
    return None


def closest_choice(group: str, name: str) -> str | None:
    """The choice of `group` that `name` most likely misspells (a synonym or a close spelling), or None."""
    names = registry.choices(group)
    alias = SYNONYMS.get(name.lower())
    near = [alias] if alias in names else difflib.get_close_matches(name.lower(), names, n=1, cutoff=0.6)
    return near[0] if near else None


def unknown_choice(group: str, name: str) -> str:
    """'normalizer=sofmax unknown (did you mean softmax?); allowed: ...', for a choice `group` does not have."""
    near = closest_choice(group, name)
    hint = f" (did you mean {near}?)" if near else ""
    return f"{group.replace('/', '.')}={name} unknown{hint}; allowed: {', '.join(registry.choices(group))}"
