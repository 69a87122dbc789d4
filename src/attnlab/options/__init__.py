"""The options of attnlab's own components: each component's checks, declared here without jax (plain Python over
the values its YAML gives). Its constructor calls them, and attnlab-train calls them on a single run's composed
config (attnlab.config.composition.refuse_bad_values), so a bad value is refused before jax loads, in the
constructor's words. A component with no declaration here (a user's own) is checked by its constructor when the run
builds it."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from attnlab.options import accelerator, heads, model, normalizers, optim, tasks, trainer

# {group: {a YAML's `_target_`: the checks of that component's options, in the order its constructors run them}}.
# Each check takes the options its keywords name.
DECLARED: dict[str, dict[str, tuple[Callable[..., None], ...]]] = {
    "accelerator": accelerator.DECLARED,
    "head": heads.DECLARED,
    "model": model.DECLARED,
    "normalizer": normalizers.DECLARED,
    "optim": optim.DECLARED,
    "task": tasks.DECLARED,
    "trainer": trainer.DECLARED,
}


def declared(group: str, target: Any) -> tuple[Callable[..., None], ...]:
    """The checks declared for a `_target_` in `group`; () for any other (a user's class, a misplaced one)."""
    return DECLARED.get(group, {}).get(target, ()) if isinstance(target, str) else ()


def check(group: str, values: dict[str, Any]) -> None:
    """Run the checks declared for the `_target_` of a composed node of `group` on its values; nothing where none
    are declared, nor where a value a check reads is missing (construct.check_keys refuses that YAML, naming its
    file)."""
    found = declared(group, values.get("_target_"))
    reads = [list(inspect.signature(option_check).parameters) for option_check in found]
    if any(key not in values for keys in reads for key in keys):
        return
    for option_check, keys in zip(found, reads):
        option_check(**{key: values[key] for key in keys})
