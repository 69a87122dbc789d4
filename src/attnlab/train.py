"""The training loop: compiled steps, evaluation, logging, best-val tracking, final test metrics."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from attnlab import calibration
from attnlab.optim import schedule
from attnlab.steps import Net, leaf_groups, make_eval, make_maps, make_train_step, probes_supported
from attnlab.summaries import Summaries, flatten_train_metrics

NONFINITE = ("skip", "stop")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Run-level settings of the loop (the `trainer` config group, plus seed and schedule)."""

    steps: int
    batch_size: int
    eval_every: int
    log_every: int
    eval_batch_size: int
    nonfinite: str
    seed: int
    lr: float
    warmup_steps: int
    progress: str = "auto"  # auto | bar | lines | none


class Diverged(Exception):
    """Raised inside the loop when the `stop` policy meets a non-finite step."""


def pad_split(split, multiple: int) -> dict[str, np.ndarray]:
    """A split as arrays padded to a multiple of the eval batch, padding rows weighted 0."""
    arrays = {f.name: np.asarray(getattr(split, f.name)) for f in dataclasses.fields(split)}
    n = arrays["targets"].shape[0]
    pad = -n % multiple
    return {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in arrays.items()}


class Progress:
    """A tqdm bar on a terminal, plain periodic lines otherwise, nothing when quiet."""

    def __init__(self, mode: str, total: int, start: int):
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode, self.bar = mode, None
        if mode == "bar":
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, initial=start, dynamic_ncols=True, desc="train")

    def update(self, step: int, n: int, loss: float | None, extra: str = ""):
        if self.bar is not None:
            self.bar.update(n)
            if loss is not None:
                self.bar.set_postfix_str(f"loss {loss:.4f}{extra}")
        elif self.mode == "lines" and loss is not None:
            print(f"step {step}: loss {loss:.4f}{extra}", flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _prefixed(prefix: str, metrics: dict) -> dict[str, float]:
    return {f"{prefix}/{k}": float(v) for k, v in metrics.items()}


def fit(net: Net, task, tx, cfg: LoopConfig, *, mesh, summaries: Summaries,
        on_log: Callable[[int, dict], None] | None = None) -> dict[str, Any]:
    """Train `net` on `task` and return the record: status, final/best metrics, timings."""
    t_start = time.perf_counter()
    graphdef, params, rest = nnx.split(net, nnx.Param, ...)
    groups, layers = leaf_groups(params)
    num_layers = len(net.body.blocks)
    num_heads = net.body.blocks[0].attn.num_heads
    replicated = NamedSharding(mesh, P())
    batch_sharding = NamedSharding(mesh, P("data")) if mesh.size > 1 else None
    state = jax.device_put({"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32),
                            "key": jax.random.key_data(jax.random.key(cfg.seed)),
                            "nonfinite": jnp.zeros((), jnp.int32)}, replicated)
    state["key"] = jax.random.wrap_key_data(state["key"])
    data = jax.device_put(pad_split(task.splits["train"], 1), replicated)
    evals = {s: jax.device_put(pad_split(task.splits[s], cfg.eval_batch_size), replicated) for s in ("val", "test")}
    baseline = {s: task.baseline(s) for s in ("val", "test")}

    common = dict(groups=groups, layers=layers, num_layers=num_layers, num_heads=num_heads,
                  batch_size=cfg.batch_size, batch_sharding=batch_sharding, probe_scores=probes_supported(net))
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

    probe = {k: evals["val"][k][:1] for k in ("inputs", "valid")}
    best = {"val/loss": math.inf}
    best_params = None
    progress = Progress(cfg.progress, cfg.steps, 0)
    pending, status, error = None, "completed", None
    t_loop, t_mark, last_logged = time.perf_counter(), time.perf_counter(), 0

    def flush(pending):
        nonlocal t_mark, last_logged
        step, metrics = pending
        host = jax.device_get(metrics)
        now = time.perf_counter()
        steps_per_s = (step - last_logged) / max(now - t_mark, 1e-9)
        t_mark, last_logged = now, step
        scalars = flatten_train_metrics(host)
        scalars.update({"opt/lr": float(lr_at(step - 1)), "perf/steps_per_sec": steps_per_s,
                        "perf/examples_per_sec": steps_per_s * cfg.batch_size})
        summaries.scalars(step, scalars)
        if on_log:
            on_log(step, scalars)
        progress.update(step, 0, scalars["train/loss"])
        if cfg.nonfinite == "stop" and host["nonfinite"] > 0:
            raise Diverged(f"non-finite loss or gradient by step {step} (policy trainer.nonfinite=stop)")

    try:
        for step in range(1, cfg.steps + 1):
            log_now = step % cfg.log_every == 0 or step == cfg.steps
            state, metrics = (step_stats if log_now else step_plain)(state, data)
            progress.update(step, 1, None)
            if pending is not None:  # read the previous log step after dispatching this one
                flush(pending)
                pending = None
            if log_now:
                pending = (step, metrics)
            if step % cfg.eval_every == 0 or step == cfg.steps:
                if pending is not None:
                    flush(pending)
                    pending = None
                val, _ = run_eval(state["params"], "val")
                summaries.scalars(step, {**_prefixed("val", val), **_prefixed("baseline", baseline["val"])})
                summaries.attention_images(maps_fn(state["params"], probe["inputs"], probe["valid"]), step)
                if val["loss"] < best["val/loss"]:
                    best = {**_prefixed("val", val), "step": step}
                    best_params = jax.tree.map(jnp.copy, state["params"])
                stats = jax.device_get(metrics.get("attn", {})) if log_now else {}
                if "beta" in stats:
                    summaries.histogram("hist/beta", stats["beta"], step)
                if "entropy" in stats:
                    summaries.histogram("hist/entropy", stats["entropy"], step)
        if pending is not None:
            flush(pending)
    except Diverged as exc:
        status, error = "diverged", str(exc)
    finally:
        progress.close()
    steps_done = int(jax.device_get(state["step"]))
    loop_s = time.perf_counter() - t_loop

    final, best_out = _test_metrics(run_eval, evals, state["params"], net.head), {}
    if best_params is not None:
        best_out = {**best, **_test_metrics(run_eval, evals, best_params, net.head)}
    summaries.scalars(steps_done, {**{k: v for k, v in final.items() if k.startswith("test/")},
                                   **_prefixed("baseline", baseline["test"])})
    return {
        "status": status, "error": error, "final": final, "best": best_out,
        "baseline": {**_prefixed("baseline", baseline["test"]), **_prefixed("baseline_val", baseline["val"])},
        "steps": steps_done, "nonfinite_steps": int(jax.device_get(state["nonfinite"])),
        "wall_time_s": time.perf_counter() - t_start, "compile_time_s": compile_s,
        "steps_per_sec": steps_done / max(loop_s, 1e-9), "params": state["params"],
    }


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
