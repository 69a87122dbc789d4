"""The training loop: compiled steps, evaluation, logging, checkpoints, resume, best-val, final metrics."""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from attnlab import calibration
from attnlab.checkpoint import Checkpoints, CheckpointError
from attnlab.optim import schedule
from attnlab.progress import Progress
from attnlab.record import write_json
from attnlab.steps import (Net, leaf_groups, make_eval, make_maps, make_train_step, probes_supported,
                           sample_batch, step_key)
from attnlab.summaries import Summaries, flatten_train_metrics


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Run-level settings of the loop (the `trainer` config group, plus seed and schedule)."""

    steps: int
    batch_size: int
    eval_every: int
    log_every: int
    eval_batch_size: int
    nonfinite: str  # skip | stop
    seed: int
    lr: float
    warmup_steps: int
    progress: str = "auto"
    checkpoint_every: int = 0  # 0: only on a signal and at the end
    resume: bool = False


class Diverged(Exception):
    """The `stop` policy met a non-finite step."""


def pad_split(split, multiple: int) -> dict[str, np.ndarray]:
    """A split as arrays padded to a multiple of the eval batch, padding rows weighted 0."""
    arrays = {f.name: np.asarray(getattr(split, f.name)) for f in dataclasses.fields(split)}
    pad = -arrays["targets"].shape[0] % multiple
    return {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in arrays.items()}


def _prefixed(prefix: str, metrics: dict) -> dict[str, float]:
    return {f"{prefix}/{k}": float(v) for k, v in metrics.items()}


class StopRequest:
    """SIGTERM/SIGINT set a flag that the loop reads between steps (graceful: checkpoint, then stop)."""

    def __init__(self):
        self.signal: int | None = None
        self._old = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signal = signum

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def fit(net: Net, task, tx, cfg: LoopConfig, *, mesh, run_dir: Path, hparams: dict | None = None) -> dict[str, Any]:
    """Train `net` on `task` in `run_dir` and return the record: status, final/best metrics, timings."""
    t_start = time.perf_counter()
    graphdef, params, rest = nnx.split(net, nnx.Param, ...)
    groups, layers = leaf_groups(params)
    num_layers, num_heads = len(net.body.blocks), net.body.blocks[0].attn.num_heads
    replicated = NamedSharding(mesh, P())
    state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32),
             "key": jax.random.key_data(jax.random.key(cfg.seed)), "nonfinite": jnp.zeros((), jnp.int32),
             "first_nonfinite": jnp.full((), -1, jnp.int32)}
    ckpt = Checkpoints(run_dir)
    best, best_params = {"val/loss": math.inf}, None
    restored = ckpt.restore_latest({"train": state, "best_params": params}) if cfg.resume else None
    if cfg.resume and restored is None:
        raise CheckpointError(f"trainer.resume=true but {ckpt.directory} holds no checkpoint")
    if restored is not None:
        _, saved, meta = restored
        state, best = saved["train"], meta["best"]
        best_params = saved["best_params"] if meta["has_best"] else None
    start = int(state["step"])
    state = jax.device_put(state, replicated)
    data = jax.device_put(pad_split(task.splits["train"], 1), replicated)
    evals = {s: jax.device_put(pad_split(task.splits[s], cfg.eval_batch_size), replicated) for s in ("val", "test")}
    baseline = {s: task.baseline(s) for s in ("val", "test")}

    common = dict(groups=groups, layers=layers, num_layers=num_layers, num_heads=num_heads,
                  batch_size=cfg.batch_size, batch_sharding=NamedSharding(mesh, P("data")) if mesh.size > 1 else None,
                  probe_scores=probes_supported(net))
    t0 = time.perf_counter()
    step_plain = make_train_step(graphdef, rest, tx, with_stats=False, **common).lower(state, data).compile()
    step_stats = make_train_step(graphdef, rest, tx, with_stats=True, **common).lower(state, data).compile()
    compile_s = time.perf_counter() - t0
    evaluate, maps_fn = make_eval(graphdef, rest, eval_batch_size=cfg.eval_batch_size), make_maps(graphdef, rest)
    lr_at = schedule(cfg.lr, cfg.warmup_steps, cfg.steps)

    def run_eval(params, split):
        mse = baseline[split].get("mse")
        metrics, outs = evaluate(params, evals[split], None if mse is None else jnp.float32(mse))
        return {k: float(v) for k, v in jax.device_get(metrics).items()}, outs

    # purge_step: a resumed run rewrites the steps after its checkpoint, so TensorBoard drops the old ones.
    summaries = Summaries(str(run_dir), purge_step=start + 1 if start else None)
    progress = Progress(cfg.progress, cfg.steps, start)
    probe = {k: evals["val"][k][:1] for k in ("inputs", "valid")}
    status, error, last_scalars = "completed", None, {}
    clock = {"t": time.perf_counter(), "step": start}
    pending = None

    def flush():
        nonlocal pending, last_scalars
        if pending is None:
            return
        step, metrics = pending
        pending = None
        host = jax.device_get(metrics)
        now = time.perf_counter()
        rate = (step - clock["step"]) / max(now - clock["t"], 1e-9)
        clock.update(t=now, step=step)
        scalars = flatten_train_metrics(host)
        scalars.update({"opt/lr": float(lr_at(step - 1)), "perf/steps_per_sec": rate,
                        "perf/examples_per_sec": rate * cfg.batch_size})
        summaries.scalars(step, scalars)
        last_scalars = scalars
        progress.update(step, 0, scalars["train/loss"])
        if cfg.nonfinite == "stop" and host["nonfinite"] > 0:
            raise Diverged(f"non-finite loss or gradient at step {int(jax.device_get(state['first_nonfinite'])) + 1} "
                           f"(trainer.nonfinite=stop)")

    def save(step):
        flush()
        ckpt.save(step, {"train": state, "best_params": best_params if best_params is not None else state["params"]},
                  {"best": best, "has_best": best_params is not None, "data_position": step})

    t_loop = time.perf_counter()
    with StopRequest() as stop:
        try:
            for step in range(start + 1, cfg.steps + 1):
                log_now = step % cfg.log_every == 0 or step == cfg.steps
                state, metrics = (step_stats if log_now else step_plain)(state, data)
                progress.update(step, 1, None)
                flush()  # the previous logging step, read after this one was dispatched
                if log_now:
                    pending = (step, metrics)
                if step % cfg.eval_every == 0 or step == cfg.steps:
                    flush()
                    val, _ = run_eval(state["params"], "val")
                    summaries.scalars(step, {**_prefixed("val", val), **_prefixed("baseline", baseline["val"])})
                    summaries.attention_images(maps_fn(state["params"], probe["inputs"], probe["valid"]), step)
                    if val["loss"] < best["val/loss"]:
                        best = {**_prefixed("val", val), "step": step}
                        best_params = jax.tree.map(jnp.copy, state["params"])
                    if log_now:
                        attn = jax.device_get(metrics.get("attn", {}))
                        for name in ("beta", "entropy"):
                            if name in attn:
                                summaries.histogram(f"hist/{name}", attn[name], step)
                if stop.signal is not None:
                    save(step)
                    status, error = "interrupted", f"stopped by signal {signal.Signals(stop.signal).name} at step {step}"
                    break
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
                    save(step)
            flush()
        except Diverged as exc:
            status, error = "diverged", str(exc)
            _diagnose(run_dir, state, data, cfg.batch_size, last_scalars)
        finally:
            progress.close()
    steps_done = int(jax.device_get(state["step"]))
    loop_s = time.perf_counter() - t_loop
    if status == "completed":
        save(steps_done)
    ckpt.close()

    final = _test_metrics(run_eval, evals, state["params"], net.head)
    best_out = {**best, **_test_metrics(run_eval, evals, best_params, net.head)} if best_params is not None else {}
    if status == "completed":
        summaries.scalars(steps_done, {**{k: v for k, v in final.items() if k.startswith("test/")},
                                       **_prefixed("baseline", baseline["test"])})
        summaries.hparams(hparams or {}, {k: v for k, v in final.items() if k.startswith(("test/", "val/"))})
    summaries.close()
    return {
        "status": status, "error": error, "final": final, "best": best_out,
        "baseline": {**_prefixed("baseline", baseline["test"]), **_prefixed("baseline_val", baseline["val"])},
        "steps": steps_done, "resumed_from": start or None, "nonfinite_steps": int(jax.device_get(state["nonfinite"])),
        "wall_time_s": time.perf_counter() - t_start, "compile_time_s": compile_s,
        "steps_per_sec": (steps_done - start) / max(loop_s, 1e-9),
    }


def _diagnose(run_dir: Path, state, data, batch_size: int, last_scalars: dict) -> None:
    """diverged.json: the first non-finite step, the last logged statistics, and that step's batch."""
    first = int(jax.device_get(state["first_nonfinite"]))
    bad = {**state, "step": jnp.int32(first)}
    batch = jax.device_get(sample_batch(data, step_key(bad), batch_size))
    write_json(Path(run_dir) / "diverged.json", {
        "first_nonfinite_step": first + 1, "last_logged": last_scalars,
        "batch": {k: np.asarray(v).tolist() for k, v in batch.items()},
    })


def _test_metrics(run_eval, evals, params, head) -> dict[str, float]:
    """val and test metrics of `params`; classification adds post-hoc temperature scaling (Guo et al. 2017)."""
    val, val_outs = run_eval(params, "val")
    test, test_outs = run_eval(params, "test")
    out = {**_prefixed("val", val), **_prefixed("test", test)}
    if head.kind == "classification":
        def flat(outs, split):
            logits = np.asarray(head.logits(outs), np.float64)
            return (logits.reshape(-1, logits.shape[-1]), np.asarray(evals[split]["targets"]).reshape(-1),
                    np.asarray(evals[split]["weights"]).reshape(-1))
        report = calibration.temperature_report(*flat(val_outs, "val"), *flat(test_outs, "test"))
        out.update({f"test/{k}": float(report[k]) for k in ("temperature", "ece_ts", "nll_ts", "accuracy_ts")})
    return out
