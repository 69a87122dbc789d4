"""The logging phase: per-seed TensorBoard writers, progress, and the deferred read-back of train metrics."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import numpy as np

from attnlab.board.summaries import Summaries, flatten_train_metrics
from attnlab.progress import Progress
from attnlab.run.throughput import Throughput
from attnlab.train.config import LoopConfig
from attnlab.train.state import LoopState
from attnlab.train.stopping import Diverged, divergence
from attnlab.train.trees import seed_slice


@dataclasses.dataclass
class Logs:
    """Where the loop reports: one Summaries writer per seed and the progress line."""

    summaries: list[Summaries]
    progress: Progress
    has_beta: bool  # some leaf group is a learned beta: log its statistics
    loss_is_nll: bool
    throughput: Throughput

    @classmethod
    def open(
        cls,
        run_dirs: list[Path],
        cfg: LoopConfig,
        start: int,
        *,
        has_beta: bool,
        loss_is_nll: bool,
        num_layers: int,
        task,
        shown_inputs,
        throughput: Throughput,
        extreme: bool = False,
    ) -> "Logs":
        # purge_step: a resumed run rewrites the steps after its checkpoint, so TensorBoard drops the old ones.
        summaries = [
            Summaries(str(d), purge_step=start + 1 if start else None, attn_map_scale=cfg.attn_map_scale)
            for d in run_dirs
        ]
        progress = Progress(cfg.progress, cfg.steps, start)
        for s in summaries:
            s.layout(num_layers, task.headline_metric, extreme)
            s.shown_text(task, np.asarray(jax.device_get(shown_inputs[0])))
        return cls(summaries, progress, has_beta, loss_is_nll, throughput)


def flush(loop: LoopState, logs: Logs, cfg: LoopConfig) -> None:
    """Read back the pending logging step's metrics and write them; the `stop` policy raises Diverged here."""
    if loop.pending is None:
        return
    step, metrics = loop.pending
    loop.pending = None
    host = jax.device_get(metrics)
    now = time.perf_counter()
    rate = (step - loop.clock_step) / max(now - loop.clock_t, 1e-9)
    loop.clock_t, loop.clock_step = now, step
    S = len(logs.summaries)
    for i in range(S):
        scalars = flatten_train_metrics(seed_slice(host, i), has_beta=logs.has_beta)
        # the rate the optimizer applied at this step (optim.current_lr), not a schedule recomputed here
        scalars.update(
            {
                "opt/lr": float(host["lr"][i]),
                "perf/steps_per_sec": rate,
                "perf/examples_per_sec": rate * cfg.batch_size * S,
                **{f"perf/{k}": v for k, v in logs.throughput.rates(rate).items() if v is not None},
            }
        )
        logs.summaries[i].scalars(step, scalars)
        loop.last_scalars[i] = scalars
    logs.progress.update(step, 0, float(np.mean(host["loss"])))
    reasons = [divergence(cfg, int(n)) for n in np.asarray(host["nonfinite"]).reshape(-1)]
    if all(reasons):  # every seed is past saving: stop now (seed_records words each seed's reason)
        raise Diverged(f"at step {int(np.min(host['first_nonfinite'])) + 1}: {reasons[0]}")
