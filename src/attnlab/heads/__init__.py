"""Output heads: each owns its output activation, its loss and its metrics, so the two never mismatch.

Choices live in configs/head/<name>.yaml; build one with `make`, check it against a task with
`kind_of` / `compatible` / `check_compatible` before building anything.
"""

from __future__ import annotations

from flax import nnx

from attnlab import construct, registry
from attnlab.checks import ConfigError

from .base import KINDS, Head
from .classification import ScoresMSE, SoftmaxCE
from .regression import MSE, HLGauss, hl_gauss_target

__all__ = [
    "KINDS",
    "MSE",
    "HLGauss",
    "Head",
    "ScoresMSE",
    "SoftmaxCE",
    "check_compatible",
    "compatible",
    "hl_gauss_target",
    "kind_of",
    "make",
]


def make(name: str, *, d_model: int, num_classes: int | None = None, rngs: nnx.Rngs, **options) -> Head:
    """Build head `name` from configs/head/<name>.yaml, its defaults updated with `options`."""
    return construct.build_choice("head", name, options, d_model=d_model, num_classes=num_classes, rngs=rngs)


def kind_of(name: str) -> str:
    """The task kind head `name` serves, without building it."""
    return registry.resolve_target(registry.load("head", name).get("_target_")).kind


def compatible(kind: str) -> list[str]:
    """Names of the heads serving task kind `kind`."""
    if kind not in KINDS:
        raise ValueError(f"unknown task kind {kind!r}; kinds: {', '.join(KINDS)}")
    return [name for name in registry.choices("head") if kind_of(name) == kind]


def check_compatible(name: str, task_kind: str, task_name: str = "task") -> None:
    """A ConfigError at configuration time when head `name` cannot serve the task (cli.build calls it)."""
    head_kind = kind_of(name)
    if head_kind != task_kind:
        raise ConfigError(
            f"head={name} serves {head_kind}, but task {task_name} is {task_kind}; "
            f"heads for {task_kind}: {', '.join(compatible(task_kind))}"
        )
