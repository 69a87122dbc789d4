"""One way from YAML to object: a group's composed node built as its `_target_`, and the one unknown-key refusal.

The CLI (every group) and attnlab.config.components all build through `build`; the command line's keys are
refused before Hydra runs (composition.no_unknown_keys) by the same `refuse_unknown`.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

from attnlab.checks import ConfigError
from attnlab.config import mistakes, registry


class UnknownKeys(ConfigError):
    """A refusal of keys no YAML has; `keys` as the message names them (group.key)."""

    def __init__(self, message: str, keys: list[str]):
        super().__init__(message)
        self.keys = keys


def refuse_unknown(unknown: list[str], allowed: list[str], group: str | None = None, choice: str | None = None) -> None:
    """A ConfigError for keys no YAML of the composed config has, in one format: the keys, the choice when the
    group's choices take different keys, where else they are options or what was probably meant, what is allowed.
    `group` None: top-level keys."""
    if not unknown:
        return
    keys = [f"{group}.{k}" if group else k for k in sorted(unknown)]
    picked = [f"{group}={choice}"] if choice else None
    owners = mistakes.owners(keys[0], picked) if choice else []
    hint = (
        f" (an option of {' and '.join(f'{group}={n}' for n in owners)})"
        if owners
        else mistakes.did_you_mean(keys[0], picked)
    )
    where = f" for {group}={choice}" if choice else ""
    if group is None:
        listed = f"allowed at the top level: {', '.join(sorted(allowed))} and the groups {', '.join(mistakes.groups())}"
    else:
        listed = f"allowed: {', '.join(sorted(allowed)) or '(none)'}"
    raise UnknownKeys(f"unknown key(s) {', '.join(keys)}{where}{hint}; {listed}", keys)


def options_of(cls, given=(), deferred=()) -> tuple[list[str], bool]:
    """(the constructor's keywords a YAML sets: all but those `given` by the caller or `deferred` to a later call,
    whether it takes **kwargs). A constructor that passes **kwargs on to its base class's (ScoreNormalizer's shared
    options) takes that one's keywords too, up the classes; it is open-ended only where no attnlab class takes them."""
    named = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        if not klass.__module__.startswith("attnlab") and klass is not cls:
            return [n for n in named if n not in given and n not in deferred], True
        params = inspect.signature(klass.__init__).parameters.values()
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        named += [p.name for p in params if p.kind in kinds and p.name != "self" and p.name not in named]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return [n for n in named if n not in given and n not in deferred], False


def check_keys(group: str, cls, node: dict[str, Any], read=(), given=(), deferred=(), choice=None) -> None:
    """Refuse a key of `node` that is no constructor option of `cls` (nor one the caller `read`s), and a constructor
    option `node` lacks: a YAML without it would silently take the constructor's default. `choice`: the YAML
    `node` comes from, named in the refusal; by default the one that builds `cls` where the group's choices vary."""
    accepted, open_ended = options_of(cls, given, deferred)
    choice = choice or (registry.name_of(group, cls) if registry.varies(group) else None)
    yaml_name = choice or registry.name_of(group, cls)
    yaml_path = registry.yaml_file(group, yaml_name) if yaml_name else f"a {group} YAML"
    unknown = [] if open_ended else sorted(set(node) - set(accepted) - set(read) - {"_target_"})
    in_file = registry.load(group, yaml_name) if unknown and yaml_name in registry.choices(group) else {}
    in_yaml = [k for k in unknown if k in in_file]
    if in_yaml:  # the command line's keys were refused before composition: these come from the file itself
        raise ConfigError(
            f"{yaml_path} sets {', '.join(in_yaml)}, which {cls.__name__}.__init__ does not take; "
            f"allowed: {', '.join(sorted([*accepted, *read]))}"
        )
    refuse_unknown(unknown, [*accepted, *read], group, choice)
    missing = [k for k in accepted if k not in node]
    if missing:
        raise ConfigError(
            f"{cls.__name__}.__init__ takes {', '.join(missing)} but {yaml_path} has no such key; "
            f"every option needs a YAML line (its default)"
        )


def build(group: str, node: dict[str, Any], read=(), deferred=(), choice: str | None = None, **given):
    """Build a group's component from its composed node: the `_target_` called with the node's options and `given`
    (what is derived, not configured: the task's sizes, the dtype, rngs, ...). `read`: the group's keys the caller
    consumes itself (model.layer_normalizers, trainer.vmap_seeds); `deferred`: arguments of a
    later call, which makes the result a functools.partial (a normalizer's num_heads, head_dim, rngs); `choice`:
    the YAML the node comes from, kept on a deferred component as `config_name` for its messages.

    Not hydra.utils.instantiate: it re-raises a constructor's ConfigError as InstantiationException
    (hydra/_internal/instantiate/_instantiate2.py, _call_target), so a bad value would stop being a one-line refusal.
    """
    if "_target_" not in node and choice:
        raise ConfigError(
            f"{registry.yaml_file(group, choice)} has no _target_; give the {group}'s class as module.Class"
        )
    cls = registry.resolve_target(node.get("_target_"), group)
    options = {k: v for k, v in node.items() if k not in read and k != "_target_"}
    around = _applied_around(group, cls, options, given, deferred)
    check_keys(group, cls, options, read, given, deferred, choice)
    if not deferred:
        built = cls(**options, **given)
        for key, value in around.items():
            setattr(built, key, value)
        return built
    return functools.partial(_named, cls, choice or registry.name_of(group, cls), **options, **given)


# Contract changes keep the release before's components working for one release (README, "Contract changes"): the
# options a group's YAML sets that the config layer then applied around a constructor that did not take them, set on
# the built component instead, with a DeprecationWarning naming the new way.
APPLIED_AROUND = {"task": ("test_lengths", "take **shared and pass it on: super().__init__(**shared)")}


def _applied_around(group: str, cls, options: dict[str, Any], given, deferred) -> dict[str, Any]:
    """{option: value} taken out of `options` for an option of APPLIED_AROUND that `cls` does not take."""
    key, new_way = APPLIED_AROUND.get(group, (None, None))
    if key not in options or deferred:
        return {}
    accepted, open_ended = options_of(cls, given, deferred)
    if key in accepted or open_ended:
        return {}
    warnings.warn(
        f"{group} {cls.__name__}: its __init__ does not take {key}, which the config layer sets on the built {group} "
        f"for this release only; {new_way} (docs/REFERENCE.md, the {group} contract)",
        DeprecationWarning,
        stacklevel=3,
    )
    return {key: options.pop(key)}


def _named(cls, config_name: str | None, **kwargs):
    """cls(**kwargs) told the YAML it was built from (None: a class no YAML names, called by its class name)."""
    built = cls(**kwargs)
    built.config_name = config_name or cls.__name__
    return built


def built_class(make) -> type:
    """The class a deferred component (`build` with `deferred`) will build."""
    return make.args[0]


def built_name(make) -> str:
    """The YAML choice a deferred component comes from, else its class name (what its messages call it)."""
    return make.args[1] or make.args[0].__name__


def build_choice(group: str, name: str, overrides: dict[str, Any], read=(), deferred=(), **given):
    """Build choice `name` of `group` from its composed YAML updated with `overrides` (YAML keys only)."""
    return build(group, {**registry.load(group, name), **overrides}, read=read, deferred=deferred, choice=name, **given)


def check_configured(group: str, cls, configs: dict[str, tuple[type, dict]], deferred=()) -> None:
    """Refuse a class of `group` no YAML builds, or whose YAMLs ({name: (class, options)}) and constructor disagree."""
    mine = {name: opts for name, (target, opts) in configs.items() if target is cls}
    if not mine:
        options = ", ".join(options_of(cls, deferred=deferred)[0]) or "no options"
        raise ConfigError(
            f"{group} {cls.__name__} ({options}) has no YAML in configs/{group}/ whose _target_ builds it"
        )
    for name, opts in mine.items():
        check_keys(group, cls, opts, deferred=deferred, choice=name)
