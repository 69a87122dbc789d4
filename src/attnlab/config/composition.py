"""A command line's config composed as Hydra will, before Hydra runs: composition errors, unknown keys and (a single
run) bad values as one line and exits.REFUSED (a sweep: each value of a swept group too), before jax loads."""

from __future__ import annotations

import sys

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from attnlab import checks, exits, options, platforms
from attnlab.checks import ConfigError
from attnlab.config import construct, mistakes, registry
from attnlab.options import accelerator as accelerator_options
from attnlab.options import trainer as trainer_options


def no_unknown_keys(cfg, overrides: list[str] | None = None) -> None:
    """Keys no YAML of the composed config has, refused before Hydra runs (construct.refuse_unknown): top-level
    keys, and each group's keys against the YAML of the choice composed (Hydra's hydra.runtime.choices, so a
    preset's choices too; else the command line `overrides`). Without either, the top level only: each group's
    keys are checked against its constructor when it is built. A key no override names comes from the composed
    preset, whose file the refusal names."""
    try:
        _refuse_unknown_keys(cfg, overrides)
    except construct.UnknownKeys as exc:
        preset = OmegaConf.select(cfg, f"hydra.runtime.choices.{registry.PRESETS}")
        named = {o.split("=", 1)[0].lstrip("+~") for o in overrides or []}
        if not preset or all(k in named for k in exc.keys):
            raise
        raise ConfigError(
            f"{exc} (set by {registry.PRESETS}={preset}: {registry.yaml_file(registry.PRESETS, preset)})"
        ) from None


def _refuse_unknown_keys(cfg, overrides: list[str] | None) -> None:
    groups, top = mistakes.groups(), mistakes.top_keys()
    construct.refuse_unknown(sorted(set(cfg) - top - set(groups)), sorted(top - {"hydra", registry.PRESETS}))
    composed = OmegaConf.select(cfg, "hydra.runtime.choices")
    picked = (
        {g: composed.get(g) for g in groups} if composed else {} if overrides is None else mistakes.chosen(overrides)
    )
    for group, choice in picked.items():
        if choice and registry.is_base(group, choice):
            raise ConfigError(
                f"{group}={choice} unknown (a base its choices inherit, no choice itself); "
                f"allowed: {', '.join(registry.choices(group))}"
            )
        if choice not in registry.choices(group) or not cfg.get(group):
            continue  # head: null (the task's default head, known once the task is)
        allowed = sorted(set(registry.load(group, choice)) - {"_target_"})
        unknown = sorted(set(cfg[group]) - set(allowed) - {"_target_"})
        if unknown:  # whether the message names the choice composes the group's YAMLs: asked only for a refusal
            construct.refuse_unknown(unknown, allowed, group, choice if registry.varies(group) else None)


def refuse_bad_values(cfg) -> None:
    """A single run's values checked as the run checks them first (assembly.check), before jax loads: each
    component's declared checks (attnlab.options), compile_cache, the seeds, task.default_head and
    model.layer_normalizers. What no declaration covers (a user's component, normalizer.impl, a value checked against
    another group, the data or the machine) is refused when the run builds it."""
    try:
        run = {
            key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
            for key, value in cfg.items()
            if key != "hydra"
        }
    except OmegaConfBaseException:  # an interpolation only a running job resolves (${hydra:...}): left to the run
        return

    def values(group: str) -> dict:
        """The group's composed values ({} for head: null, the task's default head)."""
        return run[group] if isinstance(run.get(group), dict) else {}

    def checked(group: str) -> dict:
        options.check(group, values(group))
        return values(group)

    checked("accelerator")
    accelerator_options.compile_cache(run.get("compile_cache"))
    trainer = checked("trainer")
    checked("optim")
    if "vmap_seeds" in trainer and "seed" in run:
        trainer_options.seeds(seed=run["seed"], vmap_seeds=trainer["vmap_seeds"])
    task = checked("task")
    if "default_head" in task and options.declared("task", task.get("_target_")):  # attnlab's: this option
        checks.choice("task.default_head", task["default_head"], registry.choices("head"))
    check_layer_normalizers(values("model").get("layer_normalizers"))
    checked("model")
    checked("normalizer")
    checked("head")


def check_layer_normalizers(names) -> None:
    """model.layer_normalizers: null, or a non-empty list of normalizer choices (cycled over the model's layers)."""
    if names is None:
        return
    allowed = registry.choices("normalizer")
    checks.require(
        isinstance(names, list) and len(names) > 0 and all(isinstance(n, str) for n in names),
        f"model.layer_normalizers={names!r} is invalid; allowed: null or a non-empty list of names "
        f"from {', '.join(allowed)}, e.g. [softmax,linear]",
    )
    unknown = [n for n in names if n not in allowed]
    hints = [
        f"{n} (did you mean {near}?)" if (near := mistakes.closest_choice("normalizer", n)) else n for n in unknown
    ]
    checks.require(
        not unknown,
        f"model.layer_normalizers={list(names)} names unknown normalizer(s) "
        f"{', '.join(hints)}; allowed: {', '.join(allowed)}",
    )


def one_line(message: str) -> str:
    """A multi-line library message (Hydra's) as one line, without Hydra's config search path."""
    text = str(message).split("Config search path")[0]
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def compose_overrides(overrides: list[str], groups: set[str] | None = None) -> list[list[str]]:
    """The single-run override lists a command line stands for: first values, then each other swept value
    (only of the keys in `groups` when given: a swept option's values cannot break composition, a choice can)."""

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
            variants += [base[:i] + [f"{key[i]}={v}"] + base[i + 1 :] for v in vs[1:]]
    return variants


def preset_sweep(cfg, overrides: list[str], multirun: bool) -> list[list[str]]:
    """The single-run override lists a preset's sweep (hydra.sweeper.params) adds to `overrides` for its swept
    groups the command line leaves alone; a ValueError when the preset sweeps and the command is no multirun."""
    params = OmegaConf.to_container(OmegaConf.select(cfg, "hydra.sweeper.params") or OmegaConf.create({}))
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    swept = [f"{key}={values}" for key, values in params.items() if key not in given]
    if swept and not multirun:
        preset = OmegaConf.select(cfg, f"hydra.runtime.choices.{registry.PRESETS}")
        raise ValueError(f"{registry.PRESETS}={preset} is a sweep ({' '.join(swept)}): run it with -m")
    return compose_overrides([*overrides, *swept], set(registry.groups()))[1:]


def without_config_dir(argv: list[str]) -> list[str]:
    """argv without `--config-dir D` / `-cd D` / `--config-dir=D`."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--config-dir", "-cd"):
            skip = True
        elif not arg.startswith(("--config-dir=", "-cd=")):
            out.append(arg)
    return out


def compose_or_exit(argv: list[str]) -> bool:
    """Compose the config of a command line as Hydra will, over the config directories it names (registry.use_argv);
    a composition error is one line and exits.REFUSED, and so is a run on an accelerator this environment has no
    JAX support for (a GPU preset on a CPU machine), before any job starts. Returns whether the command runs
    (False: Hydra answers it itself, --help, --cfg ...).

    Hydra would print a multi-line message (unknown choice, key not in the config) and exit 1.
    """

    override_list = None  # the single-run command line being composed, for the message's suggestions
    try:
        registry.use_argv(argv)
        argv = without_config_dir(argv)  # read by use_argv, passed on to Hydra by the caller's own argv
        overrides = [a for a in argv if not a.startswith("-")]
        multirun = any(a in mistakes.SWEEP_FLAGS for a in argv)
        override_list = overrides
        mistake = mistakes.check_argv(argv)
        if mistake:
            raise ValueError(mistake)
        if len(overrides) != len(argv) - sum(a in mistakes.SWEEP_FLAGS for a in argv):
            return False  # --help, --cfg, -cd ...: Hydra's own business
        mistake = mistakes.check_sweep(overrides, multirun)
        if mistake:
            raise ValueError(mistake)
        lists = compose_overrides([o for o in overrides if not o.startswith("hydra")], set(registry.groups()))
        unread, asked = set(), set()
        for override_list in lists:
            # `+steps=1` too, before any directory
            cfg = registry.compose_train(override_list)
            no_unknown_keys(cfg, override_list)
            unread |= set(registry.check_shadowed(dict(cfg.hydra.runtime.choices), override_list))
            asked.add(cfg.accelerator.platform)
            for swept_list in preset_sweep(cfg, override_list, multirun):
                override_list = swept_list
                swept = registry.compose_train(swept_list)
                no_unknown_keys(swept, swept_list)
                unread |= set(registry.check_shadowed(dict(swept.hydra.runtime.choices), swept_list))
                asked.add(swept.accelerator.platform)
        for message in sorted(unread):
            print(f"attnlab: warning: {message}", file=sys.stderr)
        override_list = None
        absent = sorted(p for p in asked if not platforms.platform_installed(p))
        if absent:
            raise ValueError(platforms.absent_platform(absent[0], f"attnlab-train {' '.join(argv)}"))
        if not multirun:  # a sweep's jobs are refused one by one, each a refused cell beside the others
            refuse_bad_values(cfg)
        return True
    except (*registry.COMPOSITION_ERRORS, ValueError) as exc:
        said = mistakes.explain(str(exc), override_list) or one_line(exc)
        print(f"attnlab: error: {said}", file=sys.stderr)
        sys.exit(exits.REFUSED)
