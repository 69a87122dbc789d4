"""The training loop as named phases: build the state, compile, loop (step → log → eval → checkpoint), final records.

`fit` reads top to bottom; each phase lives in a sibling module (state, evaluation, logs, loop, final).
`fit(on_compiled=...)` hands the compiled steps, state and data to a caller (scripts/bench_train.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Hashable

import jax
from flax import nnx

from attnlab.accelerator import put
from attnlab.model import Net
from attnlab.model.groups import leaf_groups
from attnlab.progress import Phases
from attnlab.run.throughput import Throughput
from attnlab.steps import probes_per_layer
from attnlab.train.config import LoopConfig
from attnlab.train.evaluation import Evaluator, final_metrics
from attnlab.train.final import seed_records
from attnlab.train.logs import Logs
from attnlab.train.loop import CompiledSteps, compile_steps, run_steps, save
from attnlab.train.state import LoopState, Placement, initial_loop
from attnlab.train.stopping import Diverged, HeldCheckpoints, StopRequest
from attnlab.train.trees import pad_split

# metrics.json's `timing`: seconds per phase, none counted twice (train_loop excludes its evaluation,
# images and checkpoints), so they sum to at most `total` (the rest: imports aside, writing the records).
PHASES = ("build", "compile", "train_loop", "evaluation", "final_metrics", "images", "checkpoints")

__all__ = ["Diverged", "LoopConfig", "LoopState", "StopRequest", "fit", "pad_split"]


def fit(
    nets: list[Net],
    task,
    tx,
    cfg: LoopConfig,
    *,
    mesh,
    run_dirs: list[Path],
    checkpoint_dir: Path,
    hparams: list[dict] | None = None,
    declared: dict | None = None,
    on_compiled: Callable[[CompiledSteps, dict, dict], None] | None = None,
    program_key: Hashable | None = None,
) -> list[dict[str, Any]]:
    """Train one net per seed (cfg.seed + i) on `task` as one vmapped program; one record per seed.

    Seed i logs to run_dirs[i]; the stacked state is checkpointed in checkpoint_dir. hparams[i] is seed
    i's HParams row, `declared` the sweep's columns (attnlab.board.hparams.declare). `on_compiled(steps, state,
    data)` is called once the steps are compiled, before any runs (a benchmark raises there to stop). Runs of one
    process with the same `program_key` (config.assembly.program_key) share their compiled programs (train.programs).
    """
    phases = Phases(cfg.progress)
    t_start = time.perf_counter()
    S = len(nets)
    with phases("build"):
        graphdef, params, _ = nnx.split(nets[0], nnx.Param, ...)
        groups, layers = leaf_groups(params)
        num_layers = len(nets[0].body.blocks)
        ckpt = HeldCheckpoints(checkpoint_dir)
        placement = Placement.of(mesh, S)
        loop = initial_loop(nets, tx, cfg, ckpt, placement)
        data = train_data(task, placement, loop.state, batch_size=cfg.batch_size, start=loop.start, stop=cfg.steps)
        evaluator = Evaluator.build(graphdef, task, cfg, S, placement.replicated, head=nets[0].head)
        devices = list(mesh.devices.flat)
        throughput = Throughput.of(nets[0], batch_size=cfg.batch_size, seq_len=task.seq_len, seeds=S, devices=devices)
    with phases("compile"):
        steps = compile_steps(
            graphdef,
            tx,
            loop.state,
            data,
            cfg,
            placement,
            groups=groups,
            layers=layers,
            num_layers=num_layers,
            num_heads=nets[0].body.blocks[0].attn.num_heads,
            probe_layers=probes_per_layer(nets[0]),
            num_seeds=S,
            scored_k=task.scored_positions(),
            key=program_key,
        )
    if on_compiled is not None:
        on_compiled(steps, loop.state, data)
    with phases("compile"):  # the evaluation programs too: no eval step pays for a compile
        evaluator = evaluator.compiled(loop.state["params"], loop.state["rest"], program_key)
    with phases("build"):
        logs = Logs.open(
            run_dirs,
            cfg,
            loop.start,
            has_beta=any(g.startswith("beta:") for g in groups),
            loss_is_nll=nets[0].head.loss_is_nll,
            num_layers=num_layers,
            task=task,
            shown_inputs=evaluator.shown["inputs"],
            throughput=throughput,
            extreme=nets[0].body.extreme_token_stats,
        )
    with phases("train_loop"):
        run_steps(loop, steps, data, cfg, logs, evaluator, ckpt, phases)
    steps_done = int(jax.device_get(loop.state["step"][0]))
    with phases("checkpoints", "checkpoint: final state"):
        if loop.status == "completed":
            save(loop, logs, cfg, ckpt, steps_done)
        ckpt.close()

    finals, best_finals = _final_metrics(loop, evaluator, nets[0].head, steps_done, phases)
    with phases("images", "images: waiting for the TensorBoard images and histograms"):
        for s in logs.summaries:
            s.wait()
    timing = {**{k: phases.seconds.get(k, 0.0) for k in PHASES}, "total": time.perf_counter() - t_start}
    steps_per_sec = (steps_done - loop.start) / max(timing["train_loop"], 1e-9)
    rates = {
        "wall_time_s": timing["total"],
        "compile_time_s": timing["compile"],
        "steps_per_sec": steps_per_sec,
        **throughput.rates(steps_per_sec),
        "model_flops_per_token": throughput.flops_per_token,
        "params": throughput.params,
        "seeds_over_devices": placement.seed_parallel,
        "timing": timing,
    }
    return seed_records(
        loop,
        cfg,
        logs,
        evaluator.baseline,
        finals,
        best_finals,
        steps_done=steps_done,
        data=data,
        hparams=hparams,
        declared=declared,
        timing=rates,
        judged_by=task.judged_by(),
    )


def _final_metrics(
    loop: LoopState, evaluator: Evaluator, head, steps_done: int, phases: Phases
) -> tuple[list[dict], list[dict]]:
    """Per seed, the final metrics of the last and of the best parameters; none for an interrupted run (its
    resumed run computes them: evaluating parameters that are not the run's result would only delay the stop)."""
    if loop.status == "interrupted":
        return [{} for _ in loop.best], [{} for _ in loop.best]
    rest = loop.state["rest"]
    with phases("final_metrics", "final metrics (last parameters)"):
        finals = final_metrics(evaluator, loop.state["params"], rest, head, phases)
    if all(b.get("step") == steps_done for b in loop.best):  # the best parameters are the last ones
        phases.note(f"final metrics (best parameters): the last ones (best val loss at step {steps_done})")
        return finals, finals
    with phases("final_metrics", "final metrics (best parameters)"):
        return finals, final_metrics(evaluator, loop.best_params, rest, head, phases)


def train_data(
    task,
    placement: Placement,
    state: dict | None = None,
    *,
    batch_size: int = 0,
    start: int = 0,
    stop: int | None = None,
):
    """What every step draws its batch from (Task.batches): resident data placed on the devices, or the task's
    stream of steps start..stop − 1 for `state`'s seed keys, one seed's data per device (per_seed)."""
    data = task.batches(
        batch_size, None if state is None else state["key"], start=start, stop=stop, sharding=placement.per_seed
    )
    return data if data.streamed else put(data, placement.replicated)
