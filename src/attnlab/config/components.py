"""Components built by name from their YAML (over the search path, so a user's choices too), for code and tests
that want one without a command line: a normalizer, attention through it, a head, a task."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from attnlab.checks import ConfigError
from attnlab.config import construct, registry
from attnlab.heads.base import KINDS
from attnlab.normalizers import Normalizer, as_mask
from attnlab.normalizers.contract import FROM_ATTENTION
from attnlab.tasks import Task, with_test_lengths


def normalizer(name: str, *, num_heads: int, head_dim: int, rngs: nnx.Rngs | None = None, **options) -> Normalizer:
    """The named normalizer from its YAML defaults updated by `options`."""
    make = construct.build_choice("normalizer", name, options, deferred=FROM_ATTENTION)
    return make(num_heads=num_heads, head_dim=head_dim, rngs=rngs or nnx.Rngs(0))


def _heads_major(x_BTNH):
    """(B,T,N,H) ↔ (B,N,T,H): the public functions speak jax.nn.dot_product_attention's layout."""
    return jnp.swapaxes(x_BTNH, 1, 2)


def attend(name: str, q_BTNH, k_BSNH, v_BSNH, mask=None, *, causal=False, with_stats=True, **options):
    """(out_BTNH, stats) of the named normalizer; mask is None, a `Mask` or a boolean (B,T,S) / (B,N,T,S) array."""
    norm = normalizer(name, num_heads=q_BTNH.shape[2], head_dim=q_BTNH.shape[3], **options)
    q_BNTH, k_BNSH, v_BNSH = (_heads_major(x) for x in (q_BTNH, k_BSNH, v_BSNH))
    out_BNTH, stats = norm(
        q_BNTH, k_BNSH, v_BNSH, as_mask(mask, causal, _shape_BNTS(q_BTNH, k_BSNH)), with_stats=with_stats
    )
    return _heads_major(out_BNTH), stats


def attention_weights(name: str, q_BTNH, k_BSNH, mask=None, *, causal=False, **options):
    """The explicit (B,N,T,S) attention matrix of the named normalizer."""
    norm = normalizer(name, num_heads=q_BTNH.shape[2], head_dim=q_BTNH.shape[3], **options)
    return norm.weights(_heads_major(q_BTNH), _heads_major(k_BSNH), as_mask(mask, causal, _shape_BNTS(q_BTNH, k_BSNH)))


def _shape_BNTS(q_BTNH, k_BSNH) -> tuple[int, int, int, int]:
    return q_BTNH.shape[0], q_BTNH.shape[2], q_BTNH.shape[1], k_BSNH.shape[1]


def head(name: str, *, d_model: int, num_classes: int | None = None, rngs: nnx.Rngs, **options):
    """Head `name` from its YAML, its defaults updated with `options`."""
    return construct.build_choice("head", name, options, d_model=d_model, num_classes=num_classes, rngs=rngs)


def head_kind(name: str) -> str:
    """The task kind head `name` serves, without building it."""
    return registry.resolve_target(registry.load("head", name).get("_target_"), "head").kind


def heads_for(kind: str) -> list[str]:
    """Names of the heads serving task kind `kind`."""
    if kind not in KINDS:
        raise ValueError(f"unknown task kind {kind!r}; kinds: {', '.join(KINDS)}")
    return [name for name, cls in registry.built("head") if cls.kind == kind]


def check_head_serves(name: str, task_kind: str, task_name: str = "the task") -> None:
    """A ConfigError at configuration time when head `name` cannot serve the task (`task_name`: task=<choice>)."""
    served = head_kind(name)
    if served != task_kind:
        raise ConfigError(
            f"head={name} serves {served}, but {task_name} is {task_kind}; "
            f"heads for {task_kind}: {', '.join(heads_for(task_kind))}"
        )


def task(name: str, **options) -> Task:
    """Task `name` from its YAML, with options overriding its defaults."""
    return task_from_node({**registry.load("task", name), **options})


def task_from_node(node: dict) -> Task:
    """A task from its composed config node, with its rebuilds at its `test_lengths` (tasks.lengths)."""
    task = construct.build("task", node)
    return with_test_lengths(task, task.test_lengths)
