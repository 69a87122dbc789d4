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
from attnlab.accelerator import seeds_over_devices
from attnlab.checkpoint import Checkpoints, CheckpointError
from attnlab.optim import schedule
from attnlab.progress import Progress
from attnlab.record import write_json
from attnlab.steps import (Net, leaf_groups, make_eval, make_maps, make_train_step, probes_supported,
                           sample_batch, step_key)
from attnlab.summaries import Summaries, eval_scalars, flatten_train_metrics
from attnlab.tb_hparams import metric_list


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
    attn_map_scale: str = "row"  # row | log | max (attnlab.tb_images.scaled)


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


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _seed(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def fit(nets: list[Net], task, tx, cfg: LoopConfig, *, mesh, run_dirs: list[Path], checkpoint_dir: Path,
        hparams: list[dict] | None = None, declared: dict | None = None) -> list[dict[str, Any]]:
    """Train one net per seed (cfg.seed + i) on `task` as one vmapped program; one record per seed.

    Seed i logs to run_dirs[i]; the stacked state is checkpointed in checkpoint_dir. hparams[i] is seed
    i's HParams row, `declared` the sweep's columns (attnlab.tb_hparams.declare).
    """
    t_start = time.perf_counter()
    S = len(nets)
    graphdef, params, rest = nnx.split(nets[0], nnx.Param, ...)
    splits = [nnx.split(n, nnx.Param, ...) for n in nets]
    groups, layers = leaf_groups(params)
    num_layers, num_heads = len(nets[0].body.blocks), nets[0].body.blocks[0].attn.num_heads
    replicated = NamedSharding(mesh, P())
    state = {"params": _stack([p for _, p, _ in splits]), "rest": _stack([r for _, _, r in splits]),
             "step": jnp.zeros((S,), jnp.int32), "nonfinite": jnp.zeros((S,), jnp.int32),
             "first_nonfinite": jnp.full((S,), -1, jnp.int32),
             "key": jnp.stack([jax.random.key_data(jax.random.key(cfg.seed + i)) for i in range(S)])}
    state["opt_state"] = jax.vmap(tx.init)(state["params"])
    ckpt = Checkpoints(checkpoint_dir)
    best = [{"val/loss": math.inf} for _ in range(S)]
    best_params = state["params"]
    restored = ckpt.restore_latest({"train": state, "best_params": best_params}) if cfg.resume else None
    if cfg.resume and restored is None:
        raise CheckpointError(f"trainer.resume=true but {ckpt.directory} holds no checkpoint")
    if restored is not None:
        _, saved, meta = restored
        state, best, best_params = saved["train"], meta["best"], saved["best_params"]
    start = int(state["step"][0])
    seed_parallel = seeds_over_devices(S, mesh.size)
    per_seed = NamedSharding(mesh, P("data")) if seed_parallel else replicated
    batch_sharding = NamedSharding(mesh, P("data")) if mesh.size > 1 and not seed_parallel else None
    state = jax.device_put(state, per_seed)
    # A real copy: the step donates (and so deletes) the state's own buffers.
    best_params = jax.tree.map(jnp.copy, jax.device_put(best_params, per_seed))
    data = jax.device_put(pad_split(task.splits["train"], 1), replicated)
    evals = {s: jax.device_put(pad_split(task.splits[s], cfg.eval_batch_size), replicated) for s in ("val", "test")}
    baseline = {s: task.baseline(s) for s in ("val", "test")}

    common = dict(groups=groups, layers=layers, num_layers=num_layers, num_heads=num_heads,
                  batch_size=cfg.batch_size, batch_sharding=batch_sharding,
                  probe_scores=probes_supported(nets[0]), num_seeds=S)
    t0 = time.perf_counter()
    step_plain = make_train_step(graphdef, tx, with_stats=False, **common).lower(state, data).compile()
    step_stats = make_train_step(graphdef, tx, with_stats=True, **common).lower(state, data).compile()
    compile_s = time.perf_counter() - t0
    evaluate = make_eval(graphdef, eval_batch_size=cfg.eval_batch_size, num_seeds=S)
    maps_fn = make_maps(graphdef, num_seeds=S)
    lr_at = schedule(cfg.lr, cfg.warmup_steps, cfg.steps)

    def run_eval(params, split):
        """Per-seed metrics dicts and the stacked outputs."""
        mse = baseline[split].get("mse")
        metrics, outs = evaluate(params, state["rest"], evals[split], None if mse is None else jnp.float32(mse))
        host = jax.device_get(metrics)
        per_seed = [{k: float(v[i]) for k, v in host.items()} for i in range(S)]
        return [{**m, **task.derived_metrics(m)} for m in per_seed], outs

    # purge_step: a resumed run rewrites the steps after its checkpoint, so TensorBoard drops the old ones.
    summaries = [Summaries(str(d), purge_step=start + 1 if start else None, attn_map_scale=cfg.attn_map_scale)
                 for d in run_dirs]
    tb = {"has_beta": any(g.startswith("beta:") for g in groups), "loss_is_nll": nets[0].head.loss_is_nll}
    progress = Progress(cfg.progress, cfg.steps, start)
    probe = {k: evals["val"][k][:1] for k in ("inputs", "valid")}  # the same fixed example for every run
    for s in summaries:
        s.layout(num_layers)
        s.probe_text(task, np.asarray(jax.device_get(probe["inputs"][0])))
    last_scalars: list[dict] = [{} for _ in range(S)]
    clock = {"t": time.perf_counter(), "step": start}
    pending = None

    def flush():
        nonlocal pending
        if pending is None:
            return
        step, metrics = pending
        pending = None
        host = jax.device_get(metrics)
        now = time.perf_counter()
        rate = (step - clock["step"]) / max(now - clock["t"], 1e-9)
        clock.update(t=now, step=step)
        for i in range(S):
            scalars = flatten_train_metrics(_seed(host, i), has_beta=tb["has_beta"])
            scalars.update({"opt/lr": float(lr_at(step - 1)), "perf/steps_per_sec": rate,
                            "perf/examples_per_sec": rate * cfg.batch_size * S})
            summaries[i].scalars(step, scalars)
            last_scalars[i] = scalars
        progress.update(step, 0, float(np.mean(host["loss"])))
        if cfg.nonfinite == "stop" and np.all(host["nonfinite"] > 0):
            raise Diverged(f"non-finite loss or gradient (trainer.nonfinite=stop)")

    def save(step):
        flush()
        ckpt.save(step, {"train": state, "best_params": best_params}, {"best": best, "data_position": step})

    status, error = "completed", None
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
                    best_params = _evaluate_step(step, state, best, best_params, run_eval, maps_fn, probe,
                                                 summaries, baseline, metrics if log_now else None, tb)
                if stop.signal is not None:
                    save(step)
                    status, error = "interrupted", f"stopped by signal {signal.Signals(stop.signal).name} at step {step}"
                    break
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
                    save(step)
            flush()
        except Diverged as exc:
            status, error = "diverged", str(exc)
        finally:
            progress.close()
    steps_done = int(jax.device_get(state["step"][0]))
    loop_s = time.perf_counter() - t_loop
    if status == "completed":
        save(steps_done)
    ckpt.close()

    nonfinite = np.asarray(jax.device_get(state["nonfinite"]))
    finals = _test_metrics(run_eval, evals, state["params"], nets[0].head, S)
    best_finals = _test_metrics(run_eval, evals, best_params, nets[0].head, S)
    records = []
    for i in range(S):
        seed_status, seed_error = status, error
        if cfg.nonfinite == "stop" and nonfinite[i] > 0:
            seed_status = "diverged"
            seed_error = (f"non-finite loss or gradient at step {int(state['first_nonfinite'][i]) + 1} "
                          f"(trainer.nonfinite=stop)")
            _diagnose(run_dirs[i], _seed(state, i), data, cfg.batch_size, last_scalars[i])
        if seed_status == "completed":
            tests = {k.split("/", 1)[1]: v for k, v in finals[i].items() if k.startswith("test/")}
            summaries[i].scalars(steps_done, {**eval_scalars("test", tests, tb["loss_is_nll"]),
                                              **_prefixed("baseline_test", baseline["test"])})
        if hparams is not None and seed_status != "interrupted":  # a resumed run writes them when it ends
            logged = {*finals[i], "train/nonfinite_steps"}
            summaries[i].hparams(hparams[i], declared or {}, metric_list(declared or {}, logged), seed_status)
        summaries[i].close()
        records.append({
            "status": seed_status, "error": seed_error, "final": finals[i],
            "best": {**best[i], **best_finals[i]} if "step" in best[i] else {},
            "baseline": {**_prefixed("baseline", baseline["test"]), **_prefixed("baseline_val", baseline["val"])},
            "steps": steps_done, "resumed_from": start or None, "nonfinite_steps": int(nonfinite[i]),
            "wall_time_s": time.perf_counter() - t_start, "compile_time_s": compile_s,
            "steps_per_sec": (steps_done - start) / max(loop_s, 1e-9), "vmapped_seeds": S,
            "seeds_over_devices": seed_parallel,
        })
    return records


def _evaluate_step(step, state, best, best_params, run_eval, maps_fn, probe, summaries, baseline, metrics, tb):
    """Validation, attention images and histograms on an eval step; returns the updated best params."""
    vals, _ = run_eval(state["params"], "val")
    maps = np.asarray(maps_fn(state["params"], state["rest"], probe["inputs"], probe["valid"]))
    attn = jax.device_get(metrics.get("attn", {})) if metrics is not None else {}
    improved = []
    for i, val in enumerate(vals):
        summaries[i].scalars(step, {**eval_scalars("val", val, tb["loss_is_nll"]),
                                    **_prefixed("baseline_val", baseline["val"])})
        summaries[i].attention_images(maps[i], step)
        for name in ("beta", "entropy"):
            values = np.asarray(attn.get(name, np.zeros(0)))[i:i + 1]
            values = values[~np.isnan(values)]  # NaN: hybrid layers without this statistic
            if values.size:
                summaries[i].histogram(f"hist/{name}", values, step)
        improved.append(val["loss"] < best[i]["val/loss"])
        if improved[-1]:
            best[i] = {**_prefixed("val", val), "step": step}
    mask = jnp.asarray(improved)
    return jax.tree.map(lambda b, p: jnp.where(mask.reshape((-1,) + (1,) * (p.ndim - 1)), p, b),
                        best_params, state["params"])


def _diagnose(run_dir: Path, state, data, batch_size: int, last_scalars: dict) -> None:
    """diverged.json: the first non-finite step, the last logged statistics, and that step's batch."""
    first = int(jax.device_get(state["first_nonfinite"]))
    bad = {**state, "step": jnp.int32(first)}
    batch = jax.device_get(sample_batch(data, step_key(bad), batch_size))
    write_json(Path(run_dir) / "diverged.json", {
        "first_nonfinite_step": first + 1, "last_logged": last_scalars,
        "batch": {k: np.asarray(v).tolist() for k, v in batch.items()},
    })


def _test_metrics(run_eval, evals, params, head, S) -> list[dict[str, float]]:
    """Per seed: val and test metrics; classification adds post-hoc temperature scaling (Guo et al. 2017)."""
    vals, val_outs = run_eval(params, "val")
    tests, test_outs = run_eval(params, "test")
    out = [{**_prefixed("val", v), **_prefixed("test", t)} for v, t in zip(vals, tests)]
    if head.kind != "classification":
        return out

    def flat(outs, split):
        """Only the positions that carry a target (MQAR: 4 of 64): the rest would cost 16× for nothing."""
        logits = np.asarray(head.logits(outs), np.float64)
        w = np.asarray(evals[split]["weights"]).reshape(-1)
        keep = w > 0
        return (logits.reshape(-1, logits.shape[-1])[keep], np.asarray(evals[split]["targets"]).reshape(-1)[keep],
                w[keep])

    for i in range(S):
        report = calibration.temperature_report(*flat(val_outs[i], "val"), *flat(test_outs[i], "test"))
        out[i].update({f"test/{k}": float(report[k]) for k in ("temperature", "ece_ts", "nll_ts", "accuracy_ts")})
    return out
