"""The compiled steps, and the step loop: step → log → eval → checkpoint, until done, diverged or signalled."""

from __future__ import annotations

import dataclasses
import signal
import time
from typing import Any, Callable, Hashable

import jax

from attnlab.checkpoint import Checkpoints
from attnlab.progress import Phases
from attnlab.steps import make_stats_step, make_train_step
from attnlab.train.config import LoopConfig
from attnlab.train.evaluation import Evaluator, evaluate_step
from attnlab.train.logs import Logs, flush
from attnlab.train.programs import kept
from attnlab.train.state import LoopState, Placement
from attnlab.train.stopping import Diverged, StopRequest


@dataclasses.dataclass(frozen=True)
class CompiledSteps:
    """The train step, and a logging step: statistics of the state (a separate program), then the same train step."""

    plain: Callable
    stats: Callable
    train_program: Any  # the compiled executables, for tools that read the program (scripts/gpu_program.py)
    statistics_program: Any


def save(loop: LoopState, logs: Logs, cfg: LoopConfig, ckpt: Checkpoints, step: int) -> None:
    """Checkpoint the stacked state, best params and best metrics (after writing any pending logs)."""
    flush(loop, logs, cfg)
    ckpt.save(step, {"train": loop.state, "best_params": loop.best_params}, {"best": loop.best})


def run_steps(
    loop: LoopState,
    steps: CompiledSteps,
    data: dict,
    cfg: LoopConfig,
    logs: Logs,
    evaluator: Evaluator,
    ckpt: Checkpoints,
    phases: Phases,
) -> None:
    """Steps loop.start+1..cfg.steps; sets loop.status/error on a signal or divergence.

    Eval steps are timed as `evaluation` (their images as `images`), saves as `checkpoints`, in `phases`.
    """
    loop.clock_t, loop.clock_step = time.perf_counter(), loop.start
    with StopRequest() as stop:
        try:
            for step in range(loop.start + 1, cfg.steps + 1):
                log_now = step % cfg.log_every == 0 or step == cfg.steps
                loop.state, metrics = (steps.stats if log_now else steps.plain)(loop.state, data)
                logs.progress.update(step, 1, None)
                flush(loop, logs, cfg)  # the previous logging step, read after this one was dispatched
                if log_now:
                    loop.pending = (step, metrics)
                if step % cfg.eval_every == 0 or step == cfg.steps:
                    flush(loop, logs, cfg)
                    jax.block_until_ready(loop.state)  # the steps' compute is the loop's time, not the evaluation's
                    with phases("evaluation"):
                        loop.best_params = evaluate_step(
                            step,
                            loop.state,
                            loop.best,
                            loop.best_params,
                            evaluator,
                            logs.summaries,
                            metrics if log_now else None,
                            logs.loss_is_nll,
                            phases=phases,
                        )
                stopped_by = stop.agreed()
                if stopped_by is not None:
                    jax.block_until_ready(loop.state)
                    with phases("checkpoints"):
                        save(loop, logs, cfg, ckpt, step)
                    loop.status = "interrupted"
                    loop.error = f"stopped by signal {signal.Signals(stopped_by).name} at step {step}"
                    break
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
                    jax.block_until_ready(loop.state)
                    with phases("checkpoints"):
                        save(loop, logs, cfg, ckpt, step)
            flush(loop, logs, cfg)
            jax.block_until_ready(loop.state)
        except Diverged as exc:
            loop.status, loop.error = "diverged", str(exc)
        finally:
            logs.progress.close()


def compile_steps(
    graphdef,
    tx,
    state,
    data,
    cfg: LoopConfig,
    placement: Placement,
    *,
    groups,
    layers,
    probe_layers: tuple[bool, ...],
    key: Hashable | None = None,
    **shape,
) -> CompiledSteps:
    """The train step and the statistics program compiled ahead of time (`shape`: their shared options), or those
    an earlier run of this process compiled under the same `key` (attnlab.train.programs).

    A logging step runs the statistics program on the state before the step, then the same train step
    as every other step: logging never changes the parameters (tests/train/test_phases.py). Each step takes
    `data.next()` (attnlab.tasks.batches): resident data is itself; streamed data (train_data: host-stream)
    is the step's own batch of windows, one per seed, read once per step by both programs of a logging step.
    """
    common = dict(
        batch_size=cfg.batch_size, batch_sharding=placement.batch, data_axis=0 if data.streamed else None, **shape
    )
    arg = data.spec()

    def build():
        plain = make_train_step(graphdef, tx, groups=groups, layers=layers, **common).lower(state, arg).compile()
        return plain, make_stats_step(graphdef, probe_layers=probe_layers, **common).lower(state, arg).compile()

    plain, statistics = kept(key, "steps", (state, arg), build)
    stream = data

    def stats(state, _):
        data = stream.next()
        extra = statistics(state, data)  # dispatched first: the train step donates `state`
        state, metrics = plain(state, data)
        return state, {**metrics, **extra}

    return CompiledSteps(
        plain=lambda state, _: plain(state, stream.next()),
        stats=stats,
        train_program=plain,
        statistics_program=statistics,
    )
