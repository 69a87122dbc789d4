"""Gradient-norm groups tagged by each module when it is built, stored as `group` variable metadata.

A module tags its own parameters with `tag(group, submodule, ...)` in its `__init__`; a
`NormalizerParam` is the `normalizer` group by type. `leaf_groups` reads the tags and raises on an
untagged parameter, so a new module that forgets to tag fails its first test instead of being
logged silently as `mlp`.
"""

from __future__ import annotations

import jax
from flax import nnx

from attnlab.normalizers import NormalizerParam

GROUPS = ("embedding", "attention", "mlp", "norm", "head", "normalizer")
# The gradient norms a train step returns as one vector (steps.grad_norms), in this order, then one per layer.
GRAD_NORMS = ("global", *(f"group/{name}" for name in GROUPS), "beta")


def in_grad_norm(name: str, group: str) -> bool:
    """Whether a leaf of gradient group `group` ("beta:<group>" for a β) counts in the norm GRAD_NORMS calls `name`."""
    if name == "beta":
        return group.startswith("beta:")
    return name == "global" or group.endswith(name.removeprefix("group/"))


def named_grad_norms(norm_K) -> dict:
    """{name: norm} of a train step's gradient-norm vector, "layer": the per-layer ones."""
    named = dict(zip(GRAD_NORMS, norm_K))
    named["layer"] = norm_K[len(GRAD_NORMS) :]
    return named


def tag(group: str, *modules: nnx.Module | nnx.Variable) -> None:
    """Tag every parameter of `modules` (or a parameter itself) not yet tagged (an inner module tags first)."""
    if group not in GROUPS:
        raise ValueError(f"gradient group {group!r} is not one of {GROUPS}")
    for module in modules:
        for _, var in [(None, module)] if isinstance(module, nnx.Variable) else nnx.iter_graph(module):
            if isinstance(var, nnx.Param) and not isinstance(var, NormalizerParam) and group_of(var) is None:
                var.set_metadata(group=group)


def group_of(var: nnx.Variable) -> str | None:
    """The tagged group of one parameter; None when its module tagged none."""
    if isinstance(var, NormalizerParam):
        return "normalizer"
    return var.get_metadata().get("group")


def _key_name(k) -> str:
    return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))))


def leaf_groups(params: nnx.State) -> tuple[list[str], list[int]]:
    """For each parameter leaf: its tagged group ("beta:" prefixed under a β) and its layer (−1 outside the blocks)."""
    groups, layers = [], []
    flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
    for path, var in flat:
        names = [_key_name(k) for k in path]
        group = group_of(var)
        if group is None:
            raise ValueError(
                f"parameter {'.'.join(names)} has no gradient group: its module must call "
                f"attnlab.model.groups.tag(group, ...) with one of {GROUPS}"
            )
        layers.append(int(names[names.index("blocks") + 1]) if "blocks" in names else -1)
        groups.append(("beta:" if "beta" in names else "") + group)
    return groups, layers
