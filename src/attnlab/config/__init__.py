"""The config layer: Hydra's composition over attnlab's configs/ and the user's config directories, `_target_`s
checked against their group's contract, components built from YAML, and the command line's refusals.

The math (normalizers, heads, tasks, the model) imports none of it.
"""

from attnlab.config import registry

# Built lazily (PEP 562): the command line's refusals use this package without importing jax.
_COMPONENTS = (
    "attend",
    "attention_weights",
    "check_head_serves",
    "head",
    "head_kind",
    "heads_for",
    "normalizer",
    "task",
    "task_from_node",
)
__all__ = [*_COMPONENTS, "use_config_dirs"]


def use_config_dirs(*config_dirs: str) -> None:
    """Make the choices of your config directories (as `--config-dir` would) available to the functions above."""
    registry.use(config_dirs)


def __getattr__(name: str):
    if name in _COMPONENTS:
        from attnlab.config import components

        return getattr(components, name)
    raise AttributeError(f"module 'attnlab.config' has no attribute {name!r}")
