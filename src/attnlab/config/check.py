"""`attnlab-check group=name ...`: a component built from its YAML (the user's config directories included) and run
through its group's contract (attnlab.testing), e.g.

    attnlab-check --config-dir mycfg normalizer=capped normalizer.cap=3.0
    attnlab-check --config-dir mycfg task=majority head=smoothed_ce

Exit 0 when every named component passes, 1 naming the first broken property and its sizes, 2 on bad input.
"""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

from attnlab import exits
from attnlab.checks import ConfigError
from attnlab.config import composition, construct, mistakes, registry

CHECKED = ("normalizer", "task", "head")


def makers(argv: list[str]) -> dict[str, tuple[str, object]]:
    """{group: (choice, maker)} for each checked group the command line names; ConfigError on bad input."""
    from attnlab.normalizers.contract import FROM_ATTENTION

    registry.use_argv(argv)
    overrides = composition.without_config_dir(argv)
    named = [o.split("=", 1) for o in overrides if "=" in o and o.split("=", 1)[0] in CHECKED]
    if not named or len(named) != len({g for g, _ in named}) or any(a.startswith("-") for a in overrides):
        raise ConfigError(
            f"usage: attnlab-check [--config-dir DIR] {{{' | '.join(f'{g}=NAME' for g in CHECKED)}}} ... "
            "[group.option=value ...], each group once"
        )
    for group, name in named:
        if name not in registry.choices(group):
            raise ConfigError(mistakes.unknown_choice(group, name))
    cfg = registry.compose_train(overrides)
    composition.no_unknown_keys(cfg, overrides)
    for message in registry.check_shadowed(mistakes.chosen(overrides), overrides):
        print(f"attnlab-check: warning: {message}", file=sys.stderr)
    out = {}
    for group, name in named:
        node = OmegaConf.to_container(cfg[group], resolve=True)
        registry.resolve_target(node.get("_target_"), group)  # a refused _target_ is bad input, before any check
        if group == "normalizer":
            out[group] = (name, construct.build(group, node, deferred=FROM_ATTENTION, choice=name))
        elif group == "task":
            out[group] = (
                name,
                lambda node=node, **given: construct.build("task", {**node, **given}),
            )
        else:
            out[group] = (name, lambda node=node, **given: construct.build("head", node, **given))
    return out


def main(argv: list[str] | None = None) -> None:
    """Console script `attnlab-check`."""
    from attnlab import testing

    argv = sys.argv[1:] if argv is None else argv
    try:
        built = makers(argv)
    except (*registry.COMPOSITION_ERRORS, ValueError) as exc:  # ConfigError included
        said = mistakes.explain(str(exc), composition.without_config_dir(argv)) or composition.one_line(exc)
        print(f"attnlab-check: error: {said}", file=sys.stderr)
        sys.exit(exits.REFUSED)
    check = {"normalizer": testing.check_normalizer, "task": testing.check_task, "head": testing.check_head}
    for group, (name, make) in built.items():
        try:
            check[group](make, name=name)
        except testing.ContractViolation as broken:
            print(f"attnlab-check: {group}={name} FAILED: {broken}", file=sys.stderr)
            sys.exit(1)
        except ConfigError as exc:
            print(f"attnlab-check: error: {group}={name}: {exc}", file=sys.stderr)
            sys.exit(exits.REFUSED)
        print(f"attnlab-check: {group}={name} passed its contract (attnlab.testing.check_{group})")
