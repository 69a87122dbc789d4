"""Phase 1: the stacked per-seed train state (fresh or resumed) and where it lives on the mesh."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attnlab.accelerator import put, seeds_over_devices
from attnlab.checkpoint import CheckpointError, Checkpoints
from attnlab.train.config import LoopConfig
from attnlab.train.trees import stack


@dataclasses.dataclass
class LoopState:
    """Everything the loop mutates between steps: the train state, best-val bookkeeping, logging clock."""

    state: dict
    best: list[dict]  # per seed: best val metrics and their step ({"val/loss": inf} before the first eval)
    best_params: Any
    start: int  # the step the run starts after (0, or the resumed checkpoint's)
    pending: tuple | None = None  # (step, metrics) of a logging step not yet read back to the host
    clock_t: float = 0.0
    clock_step: int = 0
    last_scalars: list[dict] = dataclasses.field(default_factory=list)
    status: str = "completed"
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Placement:
    """Shardings: seeds over devices when they divide evenly, else the batch over devices (or one device)."""

    replicated: NamedSharding
    per_seed: NamedSharding
    batch: NamedSharding | None
    seed_parallel: bool

    @classmethod
    def of(cls, mesh, num_seeds: int) -> "Placement":
        seed_parallel = seeds_over_devices(num_seeds, mesh.size)
        replicated = NamedSharding(mesh, P())
        per_seed = NamedSharding(mesh, P("data")) if seed_parallel else replicated
        batch = NamedSharding(mesh, P("data")) if mesh.size > 1 and not seed_parallel else None
        return cls(replicated, per_seed, batch, seed_parallel)


def fresh_state(nets, tx, seed: int) -> dict:
    """The step-0 train state (the steps' `state`): nets[i]'s params and the key of seed + i, stacked over seeds."""
    S = len(nets)
    splits = [nnx.split(n, nnx.Param, ...) for n in nets]
    state = {
        "params": stack([p for _, p, _ in splits]),
        "rest": stack([r for _, _, r in splits]),
        "step": jnp.zeros((S,), jnp.int32),
        "nonfinite": jnp.zeros((S,), jnp.int32),
        "first_nonfinite": jnp.full((S,), -1, jnp.int32),
        "key": jnp.stack([jax.random.key_data(jax.random.key(seed + i)) for i in range(S)]),
    }
    state["opt_state"] = jax.vmap(tx.init)(state["params"])
    return state


def initial_loop(nets, tx, cfg: LoopConfig, ckpt: Checkpoints, placement: Placement) -> LoopState:
    """Seed i's params from nets[i] and key from cfg.seed + i, or the latest checkpoint when resuming."""
    S = len(nets)
    state = fresh_state(nets, tx, cfg.seed)
    best = [{"val/loss": math.inf} for _ in range(S)]
    best_params = state["params"]
    restored = ckpt.restore_latest({"train": state, "best_params": best_params}) if cfg.resume else None
    if cfg.resume and restored is None:
        raise CheckpointError(f"trainer.resume=true but {ckpt.directory} holds no checkpoint")
    if restored is not None:
        _, saved, meta = restored
        state, best, best_params = saved["train"], meta["best"], saved["best_params"]
    start = int(state["step"][0])
    if restored is not None:
        print(
            f"attnlab: resumed from step {start} of {cfg.steps} (checkpoint {ckpt.directory / str(restored[0])})",
            file=sys.stderr,
            flush=True,
        )
    state = put(state, placement.per_seed)
    # A real copy: the step donates (and so deletes) the state's own buffers.
    best_params = jax.tree.map(jnp.copy, put(best_params, placement.per_seed))
    return LoopState(state=state, best=best, best_params=best_params, start=start, last_scalars=[{} for _ in range(S)])
