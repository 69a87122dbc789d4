"""The final phase: per-seed status, test scalars, HParams rows and the run records (a diverged seed's
diagnosis among them, which run.files writes as diverged.json)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.board.hparams import metric_list
from attnlab.board.summaries import eval_scalars
from attnlab.run.record import STATUSES
from attnlab.statistics import directions
from attnlab.steps import sample_batch, step_key
from attnlab.tasks.lengths import LENGTH_PREFIX
from attnlab.train.config import LoopConfig
from attnlab.train.logs import Logs
from attnlab.train.state import LoopState
from attnlab.train.stopping import divergence
from attnlab.train.trees import prefixed, seed_slice


def seed_records(
    loop: LoopState,
    cfg: LoopConfig,
    logs: Logs,
    baseline: dict,
    finals: list[dict],
    best_finals: list[dict],
    *,
    steps_done: int,
    data: dict,
    hparams: list[dict] | None,
    declared: dict | None,
    timing: dict,
    judged_by: dict,
) -> list[dict]:
    """One record per seed; writes each seed's last TensorBoard entries and closes its writer.

    `timing` holds wall_time_s, compile_time_s, steps_per_sec (training steps over the train loop's own
    seconds), tokens_per_sec, mfu, model_flops_per_token and params (run.throughput), seeds_over_devices and
    timing (seconds per phase, train.PHASES, and total), copied as they are;
    `judged_by` (Task.judged_by: the headline metric and the baselines' labels) likewise. `directions` says which
    values of each attn_ statistic are better, None for neither (statistics.directions: attnlab-report reads it).
    """
    nonfinite = np.asarray(jax.device_get(loop.state["nonfinite"]))
    first_bad = np.asarray(jax.device_get(loop.state["first_nonfinite"])) + 1
    records = []
    for i, summaries in enumerate(logs.summaries):
        status, error, diverged, diagnosis = loop.status, loop.error, None, None
        reason = divergence(cfg, int(nonfinite[i]))
        # A length never trained on (task.test_lengths) may overflow without the training having diverged.
        bad_final = sorted(k for k, v in finals[i].items() if not np.isfinite(v) and not k.startswith(LENGTH_PREFIX))
        if reason is None and bad_final and status == "completed":
            reason = f"non-finite final metric(s) {', '.join(bad_final)}"
            first_bad[i] = first_bad[i] if nonfinite[i] else steps_done
        if reason is not None and status != "interrupted":
            status, error = "diverged", f"at step {int(first_bad[i])}: {reason}"
            diverged = {"step": int(first_bad[i]), "reason": reason}
            if nonfinite[i] > 0:
                diagnosis = diagnose(seed_slice(loop.state, i), data, cfg.batch_size, loop.last_scalars[i])
        if status == "diverged":  # finite or absent: a NaN metric of a diverged run means nothing
            finals[i] = {k: v for k, v in finals[i].items() if np.isfinite(v)}
            best_finals[i] = {k: v for k, v in best_finals[i].items() if np.isfinite(v)}
        if status == "completed":
            tests = {k.split("/", 1)[1]: v for k, v in finals[i].items() if k.startswith("test/")}
            summaries.scalars(
                steps_done,
                {
                    **eval_scalars("test", tests, logs.loss_is_nll),
                    **prefixed("baseline_test", baseline["test"]),
                    **length_scalars(finals[i]),
                },
            )
        if hparams is not None and status != "interrupted":  # a resumed run writes them when it ends
            logged = {*finals[i], "train/nonfinite_steps"}
            # status as a column too: TensorBoard's session status has no "diverged" (only success/failure).
            summaries.hparams(
                {**hparams[i], "status": status},
                {**(declared or {}), "status": (list(STATUSES), False, [])},
                metric_list(declared or {}, logged),
                status,
            )
        summaries.close()
        best = loop.best[i]
        records.append(
            {
                "status": status,
                "error": error,
                "diverged": diverged,
                "final": finals[i],
                "best": {**best, **best_finals[i]} if "step" in best else {},
                "baseline": {
                    **prefixed("baseline", baseline["test"]),
                    **prefixed("baseline_val", baseline["val"]),
                    **{
                        k: v
                        for s, b in baseline.items()
                        if s.startswith(LENGTH_PREFIX)
                        for k, v in prefixed(f"baseline_{s}", b).items()
                    },
                },
                "steps": steps_done,
                "resumed_from": loop.start or None,
                "nonfinite_steps": int(nonfinite[i]),
                "wall_time_s": timing["wall_time_s"],
                "compile_time_s": timing["compile_time_s"],
                "steps_per_sec": timing["steps_per_sec"],
                **{k: timing[k] for k in ("tokens_per_sec", "mfu", "model_flops_per_token", "params")},
                "vmapped_seeds": len(logs.summaries),
                "seeds_over_devices": timing["seeds_over_devices"],
                "timing": timing["timing"],
                **judged_by,
                "directions": directions(),  # which values of each attn_ statistic are better (None: neither)
                **({"diagnosis": diagnosis} if diagnosis else {}),
            }
        )
    return records


def length_scalars(final: dict) -> dict[str, float]:
    """The test_len/<T>/<metric> entries of a final record (task.test_lengths)."""
    return {k: v for k, v in final.items() if k.startswith(LENGTH_PREFIX)}


def diagnose(state, data, batch_size: int, last_scalars: dict) -> dict:
    """What diverged.json holds: the first non-finite step, the last logged statistics, and that step's batch."""
    first = int(jax.device_get(state["first_nonfinite"]))
    bad = {**state, "step": jnp.int32(first)}
    batch = jax.device_get(sample_batch(data.for_step(first, state["key"]), step_key(bad), batch_size))
    return {
        "first_nonfinite_step": first + 1,
        "last_logged": last_scalars,
        "batch": {k: np.asarray(v).tolist() for k, v in batch.items()},
    }
