"""A command line's config composed as Hydra will, before Hydra runs: composition errors and unknown keys as one
line and exits.REFUSED (a sweep: each value of a swept group too)."""

from __future__ import annotations

import sys
from pathlib import Path

from attnlab import exits
from attnlab.checks import ConfigError


def no_unknown_keys(cfg) -> None:
    """Keys no YAML of the group has (the top level; model, optim, trainer, accelerator: one class per group),
    refused before Hydra runs, with a did-you-mean; groups whose choices build different classes (normalizer,
    head, task) refuse unknown keys when they are built, against the constructor (cli._construct)."""
    from attnlab import mistakes, registry
    from attnlab.mistakes import did_you_mean

    groups, top = mistakes.groups(), mistakes.top_keys()
    unknown = sorted(set(cfg) - top - set(groups))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(unknown)}{did_you_mean(unknown[0])}; allowed at the top level: "
                         f"{', '.join(sorted(top - {'hydra'}))} and the groups {', '.join(groups)}")
    for group in groups:
        yamls = [registry.load(group, name) for name in registry.choices(group)]
        if group not in cfg or not cfg[group] or len({y.get("_target_") for y in yamls}) > 1:
            continue
        allowed = set().union(*yamls) - {"_target_"}
        unknown = sorted(set(cfg[group]) - allowed - {"_target_"})
        if unknown:
            raise ConfigError(f"unknown key(s) {', '.join(f'{group}.{k}' for k in unknown)}"
                             f"{did_you_mean(f'{group}.{unknown[0]}')}; allowed: {', '.join(sorted(allowed))}")


def one_line(message: str) -> str:
    """A multi-line library message (Hydra's) as one line, without Hydra's config search path."""
    text = str(message).split("Config search path")[0]
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def compose_overrides(overrides: list[str], groups: set[str] | None = None) -> list[list[str]]:
    """The single-run override lists a command line stands for: first values, then each other swept value
    (only of the keys in `groups` when given: a swept option's values cannot break composition, a choice can)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hydra.errors import HydraException

    key, values = [], []
    for o in OverridesParser.create().parse_overrides(overrides):
        try:
            values.append(list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()])
        except HydraException:  # glob(...) needs the config loader, interval(...) a sweeper: left to Hydra
            continue
        key.append(o.get_key_element())
    base = [f"{k}={v[0]}" for k, v in zip(key, values)]
    variants = [base]
    for i, vs in enumerate(values):
        if groups is None or key[i].lstrip("+~") in groups:
            variants += [base[:i] + [f"{key[i]}={v}"] + base[i + 1:] for v in vs[1:]]
    return variants


def compose_or_exit(argv: list[str], config_dir: str) -> None:
    """Compose the config of a command line as Hydra will; a composition error is one line and exits.REFUSED.

    Hydra would print a multi-line message (unknown choice, key not in the config) and exit 1.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from attnlab import mistakes

    overrides = [a for a in argv if not a.startswith("-")]
    multirun = any(a in mistakes.SWEEP_FLAGS for a in argv)
    override_list = overrides  # the single-run command line being composed, for the message's suggestions
    try:
        mistake = mistakes.check_argv(argv)
        if mistake:
            raise ValueError(mistake)
        if len(overrides) != len(argv) - sum(a in mistakes.SWEEP_FLAGS for a in argv):
            return  # --help, --cfg, -cd ...: Hydra's own business
        mistake = mistakes.check_sweep(overrides, multirun)
        if mistake:
            raise ValueError(mistake)
        groups = {p.name for p in Path(config_dir).iterdir() if p.is_dir()}
        lists = compose_overrides([o for o in overrides if not o.startswith("hydra")], groups)
        with initialize_config_dir(config_dir, version_base="1.3"):
            for override_list in lists:
                no_unknown_keys(compose("train", overrides=override_list))  # `+steps=1` too, before any directory
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        print(f"attnlab: error: {mistakes.explain(str(exc), override_list) or one_line(exc)}", file=sys.stderr)
        sys.exit(exits.REFUSED)
