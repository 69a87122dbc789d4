"""The choices of each config group and their composed YAML, read through Hydra's own config loader over
Hydra's search path: attnlab's configs/ (package data) and the user's config directories (`--config-dir`,
`hydra.searchpath`), so a user's YAML adds choices to any group everywhere a choice is looked up.

A `_target_` may name any importable class that subclasses its group's contract (CONTRACTS); anything else is
refused before it is called.
"""

from __future__ import annotations

import copy
import functools
import importlib
import os
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.defaults_list import create_defaults_list
from hydra._internal.utils import create_config_search_path
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from attnlab.checks import ConfigError

# The package attnlab.configs: the repository's configs/ in a clone (an editable install maps it), package data in
# a wheel; either way a real directory.
CONFIG_DIR = Path(str(resources.files("attnlab.configs")))

# The class each group's `_target_` must subclass: the contract its component is built against.
CONTRACTS = {
    "normalizer": "attnlab.normalizers.base.Normalizer",
    "task": "attnlab.tasks.base.Task",
    "head": "attnlab.heads.base.Head",
    "model": "attnlab.model.Transformer",
    "optim": "attnlab.optim.Optimizer",
    "trainer": "attnlab.train.config.LoopConfig",
    "accelerator": "attnlab.accelerator.Accelerator",
}
# What composing a config raises on bad input (the user's, a YAML file's): answered in one line, never a traceback.
COMPOSITION_ERRORS = (HydraException, OmegaConfBaseException, yaml.YAMLError)

# The groups whose contract is a base class to subclass, never a component itself (the others name their class).
BASES = ("normalizer", "task", "head")

# The search path's entries beyond Hydra's defaults, as (provider, url) in Hydra's order: set by `use`.
_EXTRA: list[tuple[str, str]] = []
# The user's YAMLs named like one of attnlab's own, as (group, name, file): Hydra reads attnlab's first. Set by `use`.
_SHADOWED: list[tuple[str, str, Path]] = []


def use(config_dirs: Iterable[str] = (), searchpath: Iterable[str] = ()) -> None:
    """Add the user's config directories to every lookup, as Hydra adds them: `--config-dir` (provider
    command-line) and the entries of `hydra.searchpath` (file:// or pkg:// urls, or plain directories)."""
    for d in config_dirs:
        if not Path(d).is_dir():
            raise ConfigError(f"--config-dir {d!r}: no such directory")
    dirs = [("command-line", f"file://{os.path.abspath(d)}") for d in config_dirs]
    urls = [u if "://" in u else f"file://{os.path.abspath(u)}" for u in searchpath]
    _SHADOWED[:] = [shadow for url in [u for _, u in dirs] + urls for shadow in _shadows(url)]
    _EXTRA[:] = [*dirs, *(("hydra.searchpath in command-line", u) for u in urls)]


def _shadows(url: str) -> list[tuple[str, str, Path]]:
    """The YAMLs of a file:// entry that attnlab's configs/ also has, as (group, name, file) (group "." for a primary
    config); a ConfigError for an entry that is no directory."""
    schema, _, path = url.partition("://")
    if schema != "file":
        return []
    if not Path(path).is_dir():
        raise ConfigError(f"hydra.searchpath entry {url!r}: no such directory")
    if Path(path).resolve() == CONFIG_DIR.resolve():
        return []
    relatives = sorted(p.relative_to(CONFIG_DIR) for p in CONFIG_DIR.rglob("*.yaml"))
    return [
        (r.parts[0] if len(r.parts) > 1 else ".", "/".join(r.with_suffix("").parts[1:]) or r.stem, Path(path) / r)
        for r in relatives
        if (Path(path) / r).is_file()
    ]


def check_shadowed(chosen: dict[str, str | None], overrides: Iterable[str] = ()) -> list[str]:
    """Refuse a user YAML named like one of attnlab's where this command would choose it (by default, a preset or
    an override, swept values included): Hydra reads configs/ first (its primary config directory precedes
    `--config-dir` and `hydra.searchpath`), so the user's file would silently not be the one used. Returns the
    warnings for the others, which this command never reads."""
    named = {(k.lstrip("+~"), v) for o in overrides for k, _, vs in [o.partition("=")] for v in vs.split(",")}
    unread = []
    for group, name, mine in _SHADOWED:
        choice = f"{group}={name}" if group != "." else name
        message = (
            f"{display(mine)}: attnlab has its own {choice}, which Hydra reads first, so this file would never be "
            f"used; give yours another name (e.g. {choice.replace('=', '/')}_mine.yaml)"
        )
        if group == "." or chosen.get(group) == name or (group, name) in named:
            raise ConfigError(message)
        unread.append(message.replace("would never be used", "is not used (this command does not choose it)"))
    return unread


def display(path: Path) -> str:
    """A path as a message shows it: relative to the working directory when under it."""
    path = Path(path).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def yaml_file(group: str, name: str) -> str:
    """The file Hydra reads for choice `name` of `group`: the first directory on the search path that has it."""
    dirs = [CONFIG_DIR, *(Path(url.partition("://")[2]) for _, url in _EXTRA if url.startswith("file://"))]
    found = next((d / group / f"{name}.yaml" for d in dirs if (d / group / f"{name}.yaml").is_file()), None)
    return display(found) if found else f"{group}/{name}.yaml"


def use_sources(config_sources) -> None:
    """The search path of a running Hydra job (HydraConfig's runtime.config_sources), so a joblib or submitit
    worker sees the choices its launching command saw."""
    _EXTRA[:] = [
        (s.provider, f"{s.schema}://{s.path}")
        for s in config_sources
        if s.provider == "command-line" or str(s.provider).startswith("hydra.searchpath")
    ]


def use_argv(argv: list[str]) -> None:
    """`use` with the config directories a command line names: `--config-dir D` / `-cd D` / `--config-dir=D`,
    and `hydra.searchpath=[...]`; a missing directory is a ConfigError."""
    dirs, urls = [], []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in ("--config-dir", "-cd"):
            dirs.append(value if eq else (argv[i + 1] if i + 1 < len(argv) else ""))
        elif flag.lstrip("+") == "hydra.searchpath":
            urls += OverridesParser.create().parse_override(arg).value() or []
    use(dirs, urls)


@functools.lru_cache(maxsize=8)
def _loader(extra: tuple[tuple[str, str], ...]) -> ConfigLoaderImpl:
    """Hydra's loader over Hydra's search path for attnlab's configs, the extra entries before its schema entry."""
    path = create_config_search_path(f"file://{CONFIG_DIR}")
    schema = path.get_path().pop(-1)
    for provider, url in extra:
        path.append(provider, url)
    path.get_path().append(schema)
    return ConfigLoaderImpl(config_search_path=path)


def loader() -> ConfigLoaderImpl:
    return _loader(tuple(_EXTRA))


# The group of study presets (`# @package _global_`): choices that set other groups and keys, no component.
PRESETS = "experiment"


def groups() -> list[str]:
    """The component groups over the search path (hydra's own and the presets excluded)."""
    return list(_groups(tuple(_EXTRA)))


@functools.lru_cache(maxsize=None)
def _groups(extra) -> list[str]:
    return sorted(g for g in _loader(extra).get_group_options("", ObjectType.GROUP) if g not in ("hydra", PRESETS))


def choices(group: str) -> list[str]:
    """Names available in a config group over the search path, but its `_name_.yaml` bases, which hold the keys
    its variants share and are no choice of their own."""
    return list(_choices(tuple(_EXTRA), group))


@functools.lru_cache(maxsize=None)
def _choices(extra, group: str) -> list[str]:
    return sorted(n for n in _loader(extra).get_group_options(group, ObjectType.CONFIG) if not n.startswith("_"))


def is_base(group: str, name: str) -> bool:
    """Whether `name` is a `_name_.yaml` base of `group` (keys its choices share, no choice itself)."""
    return name.startswith("_") and name in loader().get_group_options(group, ObjectType.CONFIG)


def load(group: str, name: str) -> dict[str, Any]:
    """The composed YAML of one choice, composed by Hydra under `group`, or a ConfigError listing the choices."""
    if name not in choices(group):
        raise ConfigError(f"unknown {group} {name!r}; available: {', '.join(choices(group))}")
    return copy.deepcopy(_load(tuple(_EXTRA), group, name))


def _composed(extra, config_name: str | None, overrides: list[str]):
    """Hydra's composition (ConfigLoaderImpl._load_configuration_impl) of `config_name` with `overrides`, without
    the `hydra` node it would compose around them: a tenth of the time of load_configuration."""
    loader_ = _loader(extra)
    parsed, repo = loader_._parse_overrides_and_create_caching_repo(config_name, overrides)
    defaults = create_defaults_list(repo, config_name, parsed, prepend_hydra=False, skip_missing=False)
    return loader_._compose_config_from_defaults_list(defaults.defaults, repo)


@functools.lru_cache(maxsize=None)
def _load(extra, group: str, name: str) -> dict[str, Any]:
    try:
        cfg = _composed(extra, None, [f"+{group}={name}"])
    except COMPOSITION_ERRORS as exc:
        raise ConfigError(f"{group}={name}: {' '.join(str(exc).split())}") from None
    return OmegaConf.to_container(cfg[group])


def compose_train(overrides: list[str], multirun: bool = False):
    """configs/train.yaml composed with a command line's overrides over the search path (Hydra's composition)."""
    mode = RunMode.MULTIRUN if multirun else RunMode.RUN
    return loader().load_configuration("train", list(overrides), mode, from_shell=True)


def top_keys() -> set[str]:
    """The top-level keys of configs/train.yaml as Hydra composes it (hydra included, the groups not)."""
    return set(_top_keys(tuple(_EXTRA)))


@functools.lru_cache(maxsize=None)
def _top_keys(extra) -> set[str]:
    # `hydra`, which _composed leaves out, is a top-level key of every composed run
    return {*_composed(extra, "train", []), "hydra"} - set(_groups(extra))


def choices_composed(picks: tuple[str, ...]) -> dict[str, str | None]:
    """{group: choice} of configs/train.yaml composed with `group=choice` overrides (Hydra's runtime.choices)."""
    return dict(_choices_composed(tuple(_EXTRA), picks))


@functools.lru_cache(maxsize=None)
def _choices_composed(extra, picks: tuple[str, ...]) -> dict[str, str | None]:
    cfg = _loader(extra).load_configuration("train", list(picks), RunMode.RUN)
    return dict(cfg.hydra.runtime.choices)


def resolve_target(target, group: str):
    """The class a `_target_` names, imported only if it is a dotted path and returned only if it subclasses the
    group's contract; anything else is a one-line ConfigError and nothing is called."""
    contract_path = CONTRACTS.get(group)
    if not isinstance(target, str) or "." not in target:
        raise ConfigError(f"{group} _target_ {target!r} refused: give a class as module.Class")
    module, _, attr = target.rpartition(".")
    try:
        owner = importlib.import_module(module)
    except Exception as exc:  # the user's module failing to import is bad input, whatever it raised
        # a console script does not put the working directory on sys.path, so a project not installed is not found
        missing_package = isinstance(exc, ModuleNotFoundError) and exc.name == module.split(".")[0]
        hint = (
            f" (install the project that holds {exc.name} with `pip install -e <its directory>`, or put its "
            f"directory on PYTHONPATH)"
            if missing_package
            else ""
        )
        raise ConfigError(
            f"{group} _target_ {target!r}: module {module!r} failed to import: {_one_line(exc)}{hint}"
        ) from None
    cls = getattr(owner, attr, None)
    if contract_path is None:
        return cls
    contract = _contract(contract_path)
    if group in BASES and (cls is contract or getattr(cls, "abstract_base", False)):
        raise ConfigError(
            f"{group} _target_ {target!r} refused (class {cls.__name__} is a base to subclass): a {group} must be a "
            f"concrete class subclassing {contract_path}"
        )
    if not (isinstance(cls, type) and issubclass(cls, contract)):
        what = (
            "no such attribute"
            if cls is None
            else f"class {cls.__name__}"
            if isinstance(cls, type)
            else f"a {type(cls).__name__}"
        )
        raise ConfigError(
            f"{group} _target_ {target!r} refused ({what}): a {group} must be a class subclassing {contract_path}"
        )
    return cls


def _contract(path: str) -> type:
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def name_of(group: str, cls) -> str | None:
    """The choice of `group` whose `_target_` builds `cls` (the first, by name, where several do); None when none
    does. A component's YAML name comes from here, never from its class name."""
    return next((name for name, built in _built(tuple(_EXTRA), group) if built is cls), None)


def catalogue(loaded: dict[str, list[str]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{group: {choice: its YAML's scalar options}} over every component group, the options loaded for the choices
    `loaded` names per group ({} for the others, and for a name that is no choice): what an HParams experiment
    declares (board.hparams.declare)."""

    def scalars(group: str, name: str) -> dict[str, Any]:
        if name not in loaded.get(group, ()) or name not in choices(group):
            return {}
        scalar = (int, float, str, bool)
        return {k: v for k, v in load(group, name).items() if not k.startswith("_") and isinstance(v, scalar)}

    return {group: {name: scalars(group, name) for name in choices(group)} for group in groups()}


def built(group: str) -> list[tuple[str, type]]:
    """(choice, the class its `_target_` names) for each choice of `group` that resolves."""
    return list(_built(tuple(_EXTRA), group))


def varies(group: str) -> bool:
    """Whether the choices of `group` name different classes, so that which keys it takes depends on the choice:
    read from their `_target_`s, no class imported (the command line's refusals ask it before jax loads)."""
    return _varies(tuple(_EXTRA), group)


@functools.lru_cache(maxsize=None)
def _varies(extra, group: str) -> bool:
    """Whether two choices of `group` name different `_target_`s, composing choices only until two differ (a refusal
    before jax composes a few YAMLs, not every one); a choice whose YAML does not compose is refused where used."""
    first = None
    for name in _choices(extra, group):
        try:
            target = _load(extra, group, name).get("_target_")
        except ConfigError:
            continue
        if first is None:
            first = target
        elif target != first:
            return True
    return False


@functools.lru_cache(maxsize=None)
def _built(extra, group: str) -> tuple[tuple[str, Any], ...]:
    """(choice, class its `_target_` names) for each choice of `group` whose `_target_` resolves; a choice that
    does not is refused where it is used, not in every lookup of its group."""
    out = []
    for name in _choices(extra, group):
        try:
            out.append((name, resolve_target(_load(extra, group, name).get("_target_"), group)))
        except ConfigError:
            continue
    return tuple(out)
