"""Evaluation phases: validation on eval steps (best-val tracking, images, histograms) and final metrics."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from attnlab import calibration
from attnlab.continuation import make_continuation, prompt_length
from attnlab.steps import make_eval, make_maps
from attnlab.summaries import eval_scalars
from attnlab.train.config import LoopConfig, pad_split, prefixed


@dataclasses.dataclass(frozen=True)
class Evaluator:
    """The compiled eval and attention-map functions with the padded val/test splits they run on."""

    evaluate: Callable
    maps: Callable
    task: Any
    evals: dict[str, dict]  # split -> padded arrays on device
    baseline: dict[str, dict]  # split -> the task's baseline metrics
    probe: dict  # the same fixed val example for every run (attention images)
    num_seeds: int
    sample: Callable | None = None  # a text task's greedy continuation of the probe (attnlab.continuation)

    @classmethod
    def build(cls, graphdef, task, cfg: LoopConfig, num_seeds: int, replicated) -> "Evaluator":
        evals = {s: jax.device_put(pad_split(task.splits[s], cfg.eval_batch_size), replicated)
                 for s in ("val", "test")}
        return cls(evaluate=make_eval(graphdef, eval_batch_size=cfg.eval_batch_size, num_seeds=num_seeds),
                   maps=make_maps(graphdef, num_seeds=num_seeds), task=task, evals=evals,
                   baseline={s: task.baseline(s) for s in ("val", "test")},
                   probe={k: evals["val"][k][:1] for k in ("inputs", "valid")}, num_seeds=num_seeds,
                   sample=make_continuation(graphdef, seq_len=task.seq_len, num_seeds=num_seeds)
                   if hasattr(task, "decode") and task.granularity == "token" else None)

    def run(self, params, rest, split: str) -> tuple[list[dict[str, float]], Any]:
        """Per-seed metrics dicts (with the task's derived metrics) and the stacked outputs."""
        mse = self.baseline[split].get("mse")
        metrics, outs = self.evaluate(params, rest, self.evals[split], None if mse is None else jnp.float32(mse))
        host = jax.device_get(metrics)
        per_seed = [{k: float(v[i]) for k, v in host.items()} for i in range(self.num_seeds)]
        return [{**m, **self.task.derived_metrics(m)} for m in per_seed], outs


def evaluate_step(step: int, state: dict, best: list[dict], best_params, evaluator: Evaluator, summaries,
                  metrics: dict | None, loss_is_nll: bool):
    """Validation, attention images and histograms on an eval step; updates `best` in place and returns
    the best params (per seed: these params where val loss improved, else the previous best)."""
    vals, _ = evaluator.run(state["params"], state["rest"], "val")
    probe = evaluator.probe
    maps = np.asarray(evaluator.maps(state["params"], state["rest"], probe["inputs"], probe["valid"]))
    attn = jax.device_get(metrics.get("attn", {})) if metrics is not None else {}
    sample = getattr(evaluator, "sample", None)  # None: no text task (and duck-typed evaluators without one)
    if sample is not None:
        written = np.asarray(sample(state["params"], state["rest"], probe["inputs"], probe["valid"]))
    improved = []
    for i, val in enumerate(vals):
        summaries[i].scalars(step, {**eval_scalars("val", val, loss_is_nll),
                                    **prefixed("baseline_val", evaluator.baseline["val"])})
        summaries[i].attention_images(maps[i], step)
        if sample is not None:
            start = prompt_length(written.shape[-1])
            summaries[i].continuation(evaluator.task.decode(written[i, 0, :start]),
                                      evaluator.task.decode(written[i, 0, start:]), step)
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


def final_metrics(evaluator: Evaluator, params, rest, head) -> list[dict[str, float]]:
    """Per seed: val and test metrics; classification adds post-hoc temperature scaling (Guo et al. 2017)."""
    vals, val_outs = evaluator.run(params, rest, "val")
    tests, test_outs = evaluator.run(params, rest, "test")
    out = [{**prefixed("val", v), **prefixed("test", t)} for v, t in zip(vals, tests)]
    if head.kind != "classification":
        return out

    def flat(outs, split):
        """Only the positions that carry a target (MQAR: 4 of 64): the rest would cost 16× for nothing."""
        logits = np.asarray(head.logits(outs), np.float64)
        w = np.asarray(evaluator.evals[split]["weights"]).reshape(-1)
        keep = w > 0
        return (logits.reshape(-1, logits.shape[-1])[keep],
                np.asarray(evaluator.evals[split]["targets"]).reshape(-1)[keep], w[keep])

    for i in range(evaluator.num_seeds):
        report = calibration.temperature_report(*flat(val_outs[i], "val"), *flat(test_outs[i], "test"))
        out[i].update({f"test/{k}": float(report[k]) for k in ("temperature", "ece_ts", "nll_ts", "accuracy_ts")})
    return out
