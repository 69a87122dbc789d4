"""The configuration space as configs/ defines it at test time, and hypothesis strategies over it.

Nothing here lists a group, choice or option: every group directory of configs/ (but hydra), every
YAML in it, every option of every YAML (and the run-level keys of train.yaml) is discovered, and a
value is drawn from the type of the option's default: valid ones near the default (for a string, every
default any YAML gives the option and the choices its comment lists) and wrong ones (zero, negative, huge,
wrong type, out of range, unknown choice, null, not-a-number).
"""

from __future__ import annotations

import math
import re

import yaml
from cli_helpers import TINY
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hypothesis import strategies as st
from omegaconf.errors import OmegaConfBaseException

from attnlab import accelerator, checks
from attnlab.config import assembly, composition, registry

RESERVED = ("_target_", "_partial_", "defaults")
# Base: the CLI tests' tiny run, in-process (no compile cache flag, no accelerator=cpu: drawn like the rest).
BASE = [o for o in TINY if not o.startswith(("compile_cache=", "accelerator="))]


def groups() -> list[str]:
    return registry.groups()  # the component groups: hydra's own and the study presets are no option space


def options(group: str, name: str) -> dict:
    return {k: v for k, v in registry.load(group, name).items() if k not in RESERVED}


def run_level() -> dict:
    """Top-level scalar keys of train.yaml (seed, compile_cache, ...)."""
    raw = yaml.safe_load((registry.CONFIG_DIR / "train.yaml").read_text())
    return {k: v for k, v in raw.items() if k not in ("defaults", "hydra") and not isinstance(v, dict)}


def train_defaults() -> dict[str, str]:
    """The default choice of each group (train.yaml's defaults list)."""
    raw = yaml.safe_load((registry.CONFIG_DIR / "train.yaml").read_text())
    return {k: v for d in raw["defaults"] if isinstance(d, dict) for k, v in d.items() if v is not None}


# A YAML comment that opens with an option's choices, `key: value  # a | b | c ...` (model.output_gate's
# none | headwise | elementwise, whose YAMLs all default to none): bare words joined by `|`.
LISTED = re.compile(r"^\s*([\w.]+):[^#\n]*#\s*([\w.-]+(?:\s*\|\s*[\w.-]+)+)", re.M)


def strings_listed(key: str) -> set[str]:
    """The choices the comment of an option of this name lists (LISTED) in any YAML of a group, bases included."""
    return {
        word.strip()
        for g in groups()
        for path in sorted((registry.CONFIG_DIR / g).glob("*.yaml"))
        for k, words in LISTED.findall(path.read_text())
        if k == key
        for word in words.split("|")
    }


def strings_seen(key: str) -> list[str]:
    """Every string default any YAML gives an option of this name, and the choices its comments list (the valid
    spellings we know)."""
    seen = {
        v
        for g in groups()
        for c in registry.choices(g)
        for k, v in options(g, c).items()
        if k == key and isinstance(v, str)
    }
    return sorted(seen | strings_listed(key))


WRONG = ["0", "-1", "1000000000000", "1e30", "-0.001", "1.5", "abc", "true", "null", "nan", "inf", "''"]


def fmt(value) -> str:
    """A Python value as a Hydra override value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else "inf")
    if isinstance(value, str):
        return value if value.isidentifier() else f"'{value}'"
    return str(value)


def near(default, key: str) -> list[str]:
    """Values of the default's type that a user would plausibly write."""
    if isinstance(default, bool):
        return [fmt(default), fmt(not default)]
    if isinstance(default, int):
        return sorted({fmt(v) for v in (default, 1, 2, max(1, default // 2), 2 * default)})
    if isinstance(default, float):
        return sorted({fmt(v) for v in (default, default / 2, 2 * default, 0.5, 0.0)})
    if isinstance(default, str):
        return [fmt(v) for v in strings_seen(key)] or [fmt(default)]
    return ["null", "1", "0.5", "2"]  # a null default: a number is the usual replacement


@st.composite
def option_override(draw, group: str, key: str, default, wrong_weight: float = 0.3):
    """`group.key=value`, valid (near the default) or wrong, for an option of the chosen YAML."""
    wrong = draw(st.floats(0, 1)) < wrong_weight
    value = draw(st.sampled_from(WRONG if wrong else near(default, key)))
    prefix = f"{group}." if group else ""
    return f"{prefix}{key}={value}"


def outcome(overrides: list[str]):
    """('refused', message) | ('accepted', (cfg, build result)) | ('bug', exception), as the CLI would see it."""
    try:
        with initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=[*BASE, *overrides], return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:  # the CLI's compose_or_exit
        return "refused", composition.one_line(exc)
    choices = dict(cfg.hydra.runtime.choices)
    try:
        a = cfg.accelerator
        accelerator.check_options(
            a.platform, a.devices, cfg.compile_cache, a.gpu_memory_fraction, a.distributed, a.dtype
        )
        if a.platform not in ("auto", "cpu"):
            accelerator.check_platform(a.platform)
        built = assembly.assemble(cfg, choices.get("head") or cfg.task.default_head)
    except checks.ConfigError as exc:  # cli.run prints these as one line, exit 2; anything else is a bug
        return "refused", str(exc)
    except Exception as exc:  # noqa: BLE001 - anything else is what the fuzzer hunts
        return "bug", exc
    return "accepted", (cfg, built)
