"""What a training step draws its batch from: the key of a step, and a task's train split resident on the device.

Every task's training data (`Task.train_data`) has the same small interface, so the loop never asks which kind
it holds: `draw(key, batch_size)`, traced inside the step, turns it into the step's batch; `streamed` says whether
the host hands each step its own data (one per seed) or the data stays on the device; `spec()` is the step's data
argument (abstract when streamed), `next()` the argument of the next step, and `for_step(step, key_data)` the data
one seed's step `step` drew from (to show the batch of a diverged step). Resident data is its own argument.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax


def key_at(key_data, step):
    """The PRNG key of state step `step` from a seed's raw key data: a function of the seed and the step only,
    so a resumed run replays it (steps.step_key; a host stream's offsets use the same)."""
    return jax.random.fold_in(jax.random.wrap_key_data(key_data), step)


class Resident:
    """Data that stays on the device for the whole run: the step's argument is the data itself."""

    streamed: ClassVar[bool] = False

    def spec(self):
        return self

    def next(self):
        return self

    def for_step(self, step: int, key_data):
        return self


@dataclasses.dataclass(frozen=True)
class Rows(Resident):
    """A split's aligned arrays {inputs, targets, weights, valid}; a step draws batch_size rows at random."""

    arrays: dict

    def draw(self, key, batch_size: int) -> dict:
        idx = jax.random.randint(key, (batch_size,), 0, self.arrays["targets"].shape[0])
        return jax.tree.map(lambda a: a[idx], self.arrays)


jax.tree_util.register_dataclass(Rows, data_fields=["arrays"], meta_fields=[])
