"""Arrays and pytrees the loop's phases share: padded splits, prefixed scalars, the seed axis."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


def pad_split(split, multiple: int) -> dict[str, np.ndarray]:
    """A split as arrays padded to a multiple of the eval batch, padding rows weighted 0."""
    arrays = {f.name: np.asarray(getattr(split, f.name)) for f in dataclasses.fields(split)}
    pad = -arrays["targets"].shape[0] % multiple
    return {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in arrays.items()}


def prefixed(prefix: str, metrics: dict) -> dict[str, float]:
    return {f"{prefix}/{k}": float(v) for k, v in metrics.items()}


def stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def seed_slice(tree, i):
    return jax.tree.map(lambda x: x[i], tree)
