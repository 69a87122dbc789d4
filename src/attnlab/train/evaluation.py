"""Evaluation phases: validation on eval steps (best-val tracking, images, histograms) and final metrics."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab import calibration
from attnlab.steps import make_maps, over_seeds
from attnlab.summaries import eval_scalars
from attnlab.train.config import LoopConfig, pad_split, prefixed


@dataclasses.dataclass(frozen=True)
class Evaluator:
    """The compiled eval and attention-map functions with the padded val/test splits they run on."""

    evaluate: Callable  # (params, rest, split, baseline_mse) -> (metrics, calibration sample or None)
    maps: Callable
    task: Any
    evals: dict[str, dict]  # split -> padded arrays on device
    baseline: dict[str, dict]  # split -> the task's baseline metrics
    probe: dict  # the same fixed val example for every run (attention images)
    num_seeds: int
    last: dict = dataclasses.field(default_factory=dict)  # split -> (params, result) of its latest run

    @classmethod
    def build(cls, graphdef, task, cfg: LoopConfig, num_seeds: int, replicated, head) -> "Evaluator":
        evals = {s: jax.device_put(pad_split(task.splits[s], cfg.eval_batch_size), replicated)
                 for s in ("val", "test")}
        return cls(evaluate=make_evaluate(graphdef, head, eval_batch_size=cfg.eval_batch_size, num_seeds=num_seeds),
                   maps=make_maps(graphdef, num_seeds=num_seeds), task=task, evals=evals,
                   baseline={s: task.baseline(s) for s in ("val", "test")},
                   probe={k: evals["val"][k][:1] for k in ("inputs", "valid")}, num_seeds=num_seeds)

    def run(self, params, rest, split: str) -> tuple[list[dict[str, float]], Any]:
        """Per-seed metrics dicts (with the task's derived metrics) and the stacked calibration sample.

        The same params evaluated again on a split (the last eval step's, read by final_metrics) reuse
        the earlier result: the loop ends on an eval step, so its val pass is not repeated.
        """
        hit = self.last.get(split)
        if hit is not None and hit[0] is params:
            return hit[1]
        mse = self.baseline[split].get("mse")
        metrics, sample = self.evaluate(params, rest, self.evals[split], None if mse is None else jnp.float32(mse))
        host = jax.device_get(metrics)
        per_seed = [{k: float(v[i]) for k, v in host.items()} for i in range(self.num_seeds)]
        result = [{**m, **self.task.derived_metrics(m)} for m in per_seed], sample
        self.last[split] = (params, result)
        return result


def _untimed(name: str, message: str | None = None):
    return contextlib.nullcontext()


def make_evaluate(graphdef, head, *, eval_batch_size: int, num_seeds: int = 1,
                  max_positions: int = calibration.CALIBRATION_POSITIONS):
    """Jitted (params, rest, split, baseline_mse) -> (metrics, calibration sample or None), over seeds.

    One lax.scan over the split's eval batches carries the head's metric sums (Head.metric_sums) and,
    for a classification head, a (max_positions, C) buffer that collects the first weighted positions'
    logits in split order (calibration.calibration_sample of the whole split, without keeping its
    outputs): no per-batch host round-trip, and no (N, T, C) array of the whole split.
    """
    classify = head.kind == "classification"

    def evaluate(params, rest, split, baseline_mse):
        net = nnx.merge(graphdef, params, rest)
        chunks = jax.tree.map(lambda a: a.reshape(-1, eval_batch_size, *a.shape[1:]), split)
        n = min(max_positions, split["weights"].size)

        def batch(carry, b):
            sums, outs = _one_batch(net, b)
            carry = {**carry, "sums": jax.tree.map(jnp.add, carry["sums"], sums)}
            if classify:  # append this batch's weighted positions after those already kept; the rest drop
                z, y, wk, count = calibration.calibration_sample(net.head.logits(outs), b["targets"], b["weights"], n)
                at = jnp.where(jnp.arange(z.shape[0]) < count, carry["count"] + jnp.arange(z.shape[0]), n)
                carry["sample"] = tuple(buf.at[at].set(v.astype(buf.dtype), mode="drop")
                                        for buf, v in zip(carry["sample"], (z, y, wk)))
                carry["count"] = jnp.minimum(carry["count"] + count, n)
            return carry, None

        sums, outs = jax.eval_shape(functools.partial(_one_batch, net), jax.tree.map(lambda a: a[0], chunks))
        carry = {"sums": jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), sums)}
        if classify:
            C = outs.shape[-1]
            carry.update(count=jnp.int32(0), sample=(jnp.zeros((n, C), jnp.float32),
                                                     jnp.zeros((n,), split["targets"].dtype), jnp.zeros((n,), jnp.float32)))
        carry, _ = jax.lax.scan(batch, carry, chunks)
        sums = dict(carry["sums"])
        metrics = {"loss": sums.pop("loss") / jnp.maximum(sums["weight"], 1),
                   **net.head.metrics_from_sums(sums, baseline_mse=baseline_mse)}
        return metrics, ((*carry["sample"], carry["count"]) if classify else None)

    return jax.jit(over_seeds(evaluate, num_seeds, (0, 0, None, None)))


def _one_batch(net, b):
    """One eval batch's head outputs and metric sums, the loss's among them."""
    outs = net.head(net.body(b["inputs"], b["valid"])[0])
    sums = net.head.metric_sums(outs, b["targets"], b["weights"])
    # loss_b · max(W_b, 1) = Σ_b w·l for a weighted-mean loss (the Head contract), at any W_b.
    sums["loss"] = net.head.loss(outs, b["targets"], b["weights"]) * jnp.maximum(b["weights"].sum(), 1)
    return sums, outs


def evaluate_step(step: int, state: dict, best: list[dict], best_params, evaluator: Evaluator, summaries,
                  metrics: dict | None, loss_is_nll: bool, phases=None):
    """Validation, attention images and histograms on an eval step; updates `best` in place and returns
    the best params (per seed: these params where val loss improved, else the previous best).

    Images and histograms are queued to each writer's background thread; `phases` (progress.Phases)
    times the maps' forward pass and the hand-off as `images`.
    """
    vals, _ = evaluator.run(state["params"], state["rest"], "val")
    probe = evaluator.probe
    with (phases or _untimed)("images"):
        maps = np.asarray(evaluator.maps(state["params"], state["rest"], probe["inputs"], probe["valid"]))
    attn = jax.device_get(metrics.get("attn", {})) if metrics is not None else {}
    improved = []
    for i, val in enumerate(vals):
        summaries[i].scalars(step, {**eval_scalars("val", val, loss_is_nll),
                                    **prefixed("baseline_val", evaluator.baseline["val"])})
        summaries[i].attention_images(maps[i], step)
        for name in ("beta", "entropy"):
            values = np.asarray(attn.get(name, np.zeros(0)))[i:i + 1]
            values = values[~np.isnan(values)]  # NaN: hybrid layers without this statistic
            if values.size:
                summaries[i].histogram(f"hist/{name}", values, step)
        improved.append(val["loss"] < best[i]["val/loss"])
        if improved[-1]:
            best[i] = {**prefixed("val", val), "step": step}
    mask = jnp.asarray(improved)
    return jax.tree.map(lambda b, p: jnp.where(mask.reshape((-1,) + (1,) * (p.ndim - 1)), p, b),
                        best_params, state["params"])


def final_metrics(evaluator: Evaluator, params, rest, head, phases=None) -> list[dict[str, float]]:
    """Per seed: val and test metrics; classification adds post-hoc temperature scaling (Guo et al. 2017),
    fitted on the device on at most calibration.CALIBRATION_POSITIONS positions of each split (the
    numbers used: val/positions_ts, test/positions_ts). `phases` times and announces each part."""
    phase = phases or _untimed
    results = {}
    for split in ("val", "test"):
        hit = evaluator.last.get(split)
        fresh = hit is None or hit[0] is not params
        n = evaluator.evals[split]["targets"].shape[0]
        with phase("final_metrics", f"  {split} split ({n} examples, padded)" if fresh else None):
            results[split] = evaluator.run(params, rest, split)
    (vals, val_sample), (tests, test_sample) = results["val"], results["test"]
    out = [{**prefixed("val", v), **prefixed("test", t)} for v, t in zip(vals, tests)]
    if head.kind != "classification":
        return out
    with phase("final_metrics", "  temperature scaling (fit on val, report on test)"):
        report = jax.device_get(_reports(val_sample, test_sample, head.ece_bins))
    for i in range(evaluator.num_seeds):
        out[i].update({f"test/{k}": float(report[k][i]) for k in ("temperature", "ece_ts", "nll_ts", "accuracy_ts")})
        out[i].update({"val/positions_ts": float(val_sample[3][i]), "test/positions_ts": float(test_sample[3][i])})
    return out


@functools.partial(jax.jit, static_argnames="n_bins")
def _reports(val_sample, test_sample, n_bins: int):
    """calibration.temperature_report per seed (vmapped) on the (logits, labels, weights) samples."""
    return jax.vmap(functools.partial(calibration.temperature_report, n_bins=n_bins))(*val_sample[:3], *test_sample[:3])
