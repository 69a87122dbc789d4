"""Build components from their YAML in src/attnlab/configs/<group>/ (package data); the YAML is the single registry."""

from __future__ import annotations

import functools
import importlib
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from attnlab.checks import ConfigError

# Package data, so a wheel install finds it too; installed wheels are unpacked, so this is a real directory.
CONFIG_DIR = Path(str(resources.files("attnlab") / "configs"))


def choices(group: str) -> list[str]:
    """Names available in a config group: the YAML files of configs/<group>/ but its `_name_.yaml` bases, which
    hold the keys its variants share and are no choice of their own."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


def load(group: str, name: str) -> dict[str, Any]:
    """The composed YAML of one choice, as Hydra composes it under `group`, or a ConfigError listing the choices."""
    if name not in choices(group):
        raise ConfigError(f"unknown {group} {name!r}; available: {', '.join(choices(group))}")
    return _compose(group, name)


def _compose(group: str, name: str) -> dict[str, Any]:
    """A group file merged over its `defaults:` list the way Hydra merges it: each entry (a file of the same
    group) in order, `_self_` where it is listed, else last (Hydra's defaults list, version_base 1.3)."""
    raw = yaml.safe_load((CONFIG_DIR / group / f"{name}.yaml").read_text()) or {}
    defaults = raw.pop("defaults", [])
    order = defaults if "_self_" in defaults else [*defaults, "_self_"]
    return OmegaConf.to_container(OmegaConf.merge(*(raw if e == "_self_" else _compose(group, e) for e in order)))


def resolve_target(target: str):
    """Import a `_target_`; only attnlab's own classes may be built from a config."""
    if not isinstance(target, str) or not target.startswith("attnlab."):
        raise ConfigError(f"_target_ {target!r} refused: only attnlab.* classes can be built from configs")
    module, _, attr = target.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def name_of(group: str, cls) -> str | None:
    """The choice of `group` whose `_target_` builds `cls` (the first, by name, where several do); None when none does.
    A component's YAML name comes from here, never from its class name."""
    return next((name for name, built in _built(CONFIG_DIR, group) if built is cls), None)


def varies(group: str) -> bool:
    """Whether the choices of `group` build different classes, so that which keys it takes depends on the choice."""
    return len({built for _, built in _built(CONFIG_DIR, group)}) > 1


@functools.lru_cache(maxsize=None)
def _built(config_dir: Path, group: str) -> tuple[tuple[str, Any], ...]:
    """(choice, class its `_target_` names) for each choice of `group` in `config_dir`."""
    return tuple((name, resolve_target(load(group, name)["_target_"])) for name in choices(group))
