"""Evaluation phases: validation on eval steps (best-val tracking, images, histograms) and final metrics."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Hashable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.accelerator import put
from attnlab.board.summaries import eval_scalars
from attnlab.heads import calibration
from attnlab.heads.base import total, upcast
from attnlab.statistics import STATISTICS, final
from attnlab.steps import make_maps, over_seeds, scored
from attnlab.tasks.lengths import LENGTH_PREFIX, split_name
from attnlab.train.config import LoopConfig
from attnlab.train.programs import kept
from attnlab.train.trees import pad_split, prefixed


@dataclasses.dataclass(frozen=True)
class Evaluator:
    """The eval, attention-map, continuation and temperature-fit programs with the padded val/test splits
    they run on; `compiled` compiles them ahead of time (fit's compile phase), so no eval step compiles."""

    programs: dict[str, Callable]  # split -> (params, rest, split, baseline_mse, temperature_S) -> (metrics, sample)
    maps: Callable
    task: Any
    evals: dict[str, dict]  # split -> padded arrays on device
    baseline: dict[str, dict]  # split -> the task's baseline metrics
    shown: dict  # the shown example: the same fixed val example for every run (attention images, text)
    num_seeds: int
    replicated: Any  # the sharding of every argument that is not params (splits, temperatures)
    fit: Callable  # (logits, labels, weights) -> temperature_S: calibration.fit_temperature per seed
    sample: Callable | None = None  # the task's continuation of the shown example per seed (Task.continuation), or None
    last: dict = dataclasses.field(default_factory=dict)  # split -> (params, temperature, result), latest run

    @classmethod
    def build(cls, graphdef, task, cfg: LoopConfig, num_seeds: int, replicated, head) -> "Evaluator":
        evals = {s: put(eval_split(task, s, cfg.eval_batch_size), replicated) for s in ("val", "test")}
        evaluate = make_evaluate(
            graphdef, head, eval_batch_size=cfg.eval_batch_size, num_seeds=num_seeds, scored_k=task.scored_positions()
        )
        programs, baseline = {s: evaluate for s in evals}, {s: task.baseline(s) for s in ("val", "test")}
        if cfg.final_stats:  # the test split's final metrics carry the attention and residual statistics
            programs["test"] = make_evaluate(
                graphdef,
                head,
                eval_batch_size=cfg.eval_batch_size,
                num_seeds=num_seeds,
                scored_k=task.scored_positions(),
                attention_stats=True,
            )
        for length, at in task.at_lengths.items():  # task.test_lengths: one more program per length
            name, rows = split_name(length), length_batch(cfg.eval_batch_size, task.seq_len, at.seq_len)
            evals[name] = jax.device_put(eval_split(at, "test", rows), replicated)
            programs[name] = make_evaluate(
                graphdef,
                head,
                eval_batch_size=rows,
                num_seeds=num_seeds,
                scored_k=at.scored_positions(),
                attention_stats=cfg.final_stats,
            )
            baseline[name] = at.baseline("test")
        return cls(
            programs=programs,
            maps=make_maps(graphdef, num_seeds=num_seeds),
            task=task,
            evals=evals,
            baseline=baseline,
            shown={k: evals["val"][k][:1] for k in ("inputs", "valid")},
            num_seeds=num_seeds,
            replicated=replicated,
            fit=_fit,
            sample=over_all_seeds(task.continuation(graphdef), num_seeds),
        )

    def compiled(self, params, rest, key: Hashable | None = None) -> "Evaluator":
        """The same evaluator with every program compiled ahead of time for these params (one per split), or those
        an earlier run of this process compiled under the same `key` (attnlab.train.programs)."""
        args = {s: (params, rest, self.evals[s], self._mse(s), self._temperature(None)) for s in self.evals}
        shown = (params, rest, self.shown["inputs"], self.shown["valid"])

        def build() -> dict[str, Any]:
            compiled = {s: self.programs[s].lower(*a).compile() for s, a in args.items()}
            _, sample = compiled["val"].out_info  # the fit takes the val sample as (and where) the program leaves it
            return dict(
                programs=compiled,
                maps=self.maps.lower(*shown).compile(),
                sample=None if self.sample is None else self.sample.lower(*shown).compile(),
                fit=self.fit if sample is None else self.fit.lower(*sample[:3]).compile(),
            )

        return dataclasses.replace(self, **kept(key, "evaluation", args, build))

    @property
    def length_splits(self) -> list[str]:
        """The test splits at task.test_lengths, in length order (test_len/<T>)."""
        return [s for s in self.evals if s.startswith(LENGTH_PREFIX)]

    def _mse(self, split: str):
        mse = self.baseline[split].get("mse")
        return None if mse is None else jnp.float32(mse)

    def _temperature(self, temperature):
        """Per-seed temperatures placed as the programs expect (ones: no temperature scaling)."""
        return put(jnp.ones(self.num_seeds, jnp.float32) if temperature is None else temperature, self.replicated)

    def run(self, params, rest, split: str, temperature=None) -> tuple[list[dict[str, float]], Any]:
        """Per-seed metrics dicts (with the task's derived metrics) and the stacked calibration sample
        (logits, labels, weights, count; None for a regression head). With per-seed `temperature`s, a
        classification head's metrics add ece_ts, nll_ts and accuracy_ts: softmax(logits / T) on the split.

        The same params evaluated again on a split (the last eval step's, read by final_metrics) reuse
        the earlier result: the loop ends on an eval step, so its val pass is not repeated.
        """
        hit = self.last.get(split)
        if hit is not None and hit[0] is params and hit[1] is temperature:
            return hit[2]
        metrics, sample = self.programs[split](
            params, rest, self.evals[split], self._mse(split), self._temperature(temperature)
        )
        host = {k: v for k, v in jax.device_get(metrics).items() if temperature is not None or not k.endswith("_ts")}
        per_seed = [{k: float(v[i]) for k, v in host.items()} for i in range(self.num_seeds)]
        result = [{**m, **self.task.derived_metrics(m, split)} for m in per_seed], sample
        self.last[split] = (params, temperature, result)
        return result


GROUP = "group/"  # an eval split's row groups (Task.row_groups) as arrays group/<name>


def eval_split(task, split: str, multiple: int) -> dict[str, np.ndarray]:
    """A task's split padded to a multiple of the eval batch (pad_split), with its row groups as group/<name>
    (padding rows in none)."""
    arrays = pad_split(task.splits[split], multiple)
    groups = task.row_groups(np.asarray(task.splits[split].inputs))
    pad = arrays["valid"].shape[0] - len(task.splits[split])
    return {**arrays, **{GROUP + g: np.pad(np.asarray(m, bool), ((0, pad), (0, 0))) for g, m in groups.items()}}


def _untimed(name: str, message: str | None = None):
    return contextlib.nullcontext()


def length_batch(eval_batch_size: int, train_len: int, length: int) -> int:
    """Rows per eval batch at a test length: beyond the training length, as many as keep a batch's attention
    matrices (rows × length², materialised for the statistics) the size of the training length's."""
    return eval_batch_size if length <= train_len else max(1, eval_batch_size * train_len**2 // length**2)


def make_evaluate(
    graphdef,
    head,
    *,
    eval_batch_size: int,
    num_seeds: int = 1,
    max_positions: int = calibration.CALIBRATION_POSITIONS,
    scored_k: int | None = None,
    attention_stats: bool = False,
):
    """Jitted (params, rest, split, baseline_mse, temperature) -> (metrics, calibration sample or None), over seeds.

    One lax.scan over the split's eval batches carries the head's metric sums (Head.metric_sums) and,
    for a classification head, a (max_positions, C) buffer that collects the first weighted positions'
    logits in split order (calibration.calibration_sample of the whole split, without keeping its
    outputs): no per-batch host round-trip, and no (N, T, C) array of the whole split. A classification
    head's sums also hold those of softmax(logits / temperature) (the *_ts metrics).
    `attention_stats` adds the final statistics (attnlab.statistics.final: those a Statistic declares final) as
    attn_<name>/layer_i: per-batch means weighted by real examples.
    """
    classify = head.kind == "classification"

    def evaluate(params, rest, split, baseline_mse, temperature):
        net = nnx.merge(graphdef, params, rest)
        chunks = jax.tree.map(lambda a: a.reshape(-1, eval_batch_size, *a.shape[1:]), split)
        n = min(max_positions, split["weights"].size)

        def batch(carry, b):
            sums, (outs, y, w) = _one_batch(net, b, temperature, scored_k, attention_stats)
            carry = {**carry, "sums": jax.tree.map(jnp.add, carry["sums"], sums)}
            if classify:  # append this batch's weighted positions after those already kept; the rest drop
                z, y, wk, count = calibration.calibration_sample(net.head.logits(outs), y, w, n)
                at = jnp.where(jnp.arange(z.shape[0]) < count, carry["count"] + jnp.arange(z.shape[0]), n)
                carry["sample"] = tuple(
                    buf.at[at].set(v.astype(buf.dtype), mode="drop") for buf, v in zip(carry["sample"], (z, y, wk))
                )
                carry["count"] = jnp.minimum(carry["count"] + count, n)
            return carry, None

        sums, (outs, _, _) = jax.eval_shape(
            functools.partial(_one_batch, net, t=temperature, k=scored_k, attention_stats=attention_stats),
            jax.tree.map(lambda a: a[0], chunks),
        )
        carry = {"sums": jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), sums)}
        if classify:
            C = outs.shape[-1]
            buffers = (
                jnp.zeros((n, C), jnp.float32),
                jnp.zeros((n,), split["targets"].dtype),
                jnp.zeros((n,), jnp.float32),
            )
            carry.update(count=jnp.int32(0), sample=buffers)
        carry, _ = jax.lax.scan(batch, carry, chunks)
        sums = dict(carry["sums"])
        attn = final.means(sums.pop("attn")) if attention_stats else {}
        w = jnp.maximum(sums["weight"], 1)
        ts = (
            {
                "ece_ts": jnp.abs(sums.pop("ece_gap_ts")).sum() / w,
                "nll_ts": sums.pop("nll_ts") / w,
                "accuracy_ts": sums.pop("accuracy_ts") / w,
            }
            if classify
            else {}
        )
        groups = {g: sums.pop(GROUP + g) for g in [k[len(GROUP) :] for k in sums if k.startswith(GROUP)]}
        metrics = {
            "loss": sums.pop("loss") / w,
            **net.head.metrics_from_sums(sums, baseline_mse=baseline_mse),
            **ts,
            **attn,
            **{f"{g}/{m}": v for g, g_sums in groups.items() for m, v in _group_metrics(net.head, g_sums).items()},
        }
        return metrics, ((*carry["sample"], carry["count"]) if classify else None)

    per_seed = over_seeds(evaluate, num_seeds, (0, 0, 0, None, 0))

    def over_all(params, rest, split, baseline_mse, temperature):
        # The split broadcast to every seed rather than vmapped unbatched: XLA's CPU backend (jax 0.10.2) gives seeds
        # 3, 4, ... the numbers of seeds 1, 2, ... for a mean over one-hot labels shared by the vmapped seeds at
        # some sizes (3 seeds of 250 × 64 × 64 logits; tests/train/test_phases.py reproduces it).
        split = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_seeds, *a.shape)), split)
        return per_seed(params, rest, split, baseline_mse, temperature)

    return jax.jit(over_all)


HISTOGRAMS = tuple(s.name for s in STATISTICS if s.histogram)  # hist/<name> on eval steps


def _group_metrics(head, sums: dict) -> dict:
    """A row group's loss and head metric (accuracy, or mse) from its sums."""
    metric = "accuracy" if head.kind == "classification" else "mse"
    return {"loss": sums.pop("loss") / jnp.maximum(sums["weight"], 1), metric: head.metrics_from_sums(sums)[metric]}


def _one_batch(net, b, t, k, attention_stats=False):
    """One eval batch's metric sums (the loss's, and at temperature t the *_ts ones) and the head outputs,
    targets and weights they came from (at the k scored positions per example: steps.scored);
    with `attention_stats`, sums["attn"] holds the layers' statistics times the batch's real examples."""
    feats, stats = net.body(b["inputs"], b["valid"], with_stats=attention_stats)
    outs, y, w = scored(feats, b, k)
    outs = net.head(outs)
    sums = net.head.metric_sums(outs, y, w)
    w_up = upcast(w)
    # loss_b · max(W_b, 1) = Σ_b w·l for a weighted-mean loss (the Head contract), at any W_b.
    sums["loss"] = total(net.head.loss(outs, y, w), w_up)
    if net.head.kind == "classification":
        z, y_c = upcast(net.head.logits(outs)) / t, net.head._targets(y, w_up)
        sums.update(
            nll_ts=total(calibration.nll(z, y_c, w_up), w_up),
            accuracy_ts=total(calibration.accuracy(z, y_c, w_up), w_up),
            ece_gap_ts=calibration.ece_gaps(jax.nn.softmax(z, axis=-1), y_c, w_up, net.head.ece_bins),
        )
    for name in [k for k in b if k.startswith(GROUP)]:  # the task's row groups: their loss and metric
        outs_g, y_g, w_g = scored(feats, {**b, "weights": b["weights"] * b[name]}, k)
        outs_g = net.head(outs_g)
        sums[name] = net.head.metric_sums(outs_g, y_g, w_g)
        sums[name]["loss"] = total(net.head.loss(outs_g, y_g, w_g), upcast(w_g))
    if attention_stats:
        examples = b["valid"].any(1).sum().astype(jnp.float32)  # padding rows (pad_split) have no valid token
        rows_BT = b.get(GROUP + "dormant", b["valid"]) & b["valid"]
        sums["attn"] = final.batch_sums(
            stats, lambda: net.body.attention_maps(b["inputs"], b["valid"]), rows_BT, examples
        )
    return sums, (outs, y, w)


def over_all_seeds(sample: Callable | None, num_seeds: int) -> Callable | None:
    """A task's per-seed (params, rest, inputs, valid) program jitted over the seed axis of params and rest."""
    return None if sample is None else jax.jit(over_seeds(sample, num_seeds, (0, 0, None, None)))


def evaluate_step(
    step: int,
    state: dict,
    best: list[dict],
    best_params,
    evaluator: Evaluator,
    summaries,
    metrics: dict | None,
    loss_is_nll: bool,
    phases=None,
):
    """Validation, attention images and histograms on an eval step; updates `best` in place and returns
    the best params (per seed: these params where val loss improved, else the previous best).

    Images and histograms are queued to each writer's background thread; `phases` (progress.Phases)
    times the maps' forward pass and the hand-off as `images`.
    """
    vals, _ = evaluator.run(state["params"], state["rest"], "val")
    shown = evaluator.shown
    with (phases or _untimed)("images"):
        maps = np.asarray(evaluator.maps(state["params"], state["rest"], shown["inputs"], shown["valid"]))
    attn = jax.device_get(metrics.get("attn", {})) if metrics is not None else {}
    sample = getattr(evaluator, "sample", None)  # None: the task writes no sample (and duck-typed evaluators)
    if sample is not None:
        written = np.asarray(sample(state["params"], state["rest"], shown["inputs"], shown["valid"]))
    improved = []
    for i, val in enumerate(vals):
        summaries[i].scalars(
            step, {**eval_scalars("val", val, loss_is_nll), **prefixed("baseline_val", evaluator.baseline["val"])}
        )
        summaries[i].attention_images(maps[i], step)
        if sample is not None:
            summaries[i].continuation(*evaluator.task.split_continuation(written[i, 0]), step)
        for name in HISTOGRAMS:
            values = np.asarray(attn.get(name, np.zeros(0)))[i : i + 1]
            values = values[~np.isnan(values)]  # NaN: hybrid layers without this statistic
            if values.size:
                summaries[i].histogram(f"hist/{name}", values, step)
        improved.append(val["loss"] < best[i]["val/loss"])
        if improved[-1]:
            best[i] = {**prefixed("val", val), "step": step}
    mask = jnp.asarray(improved)
    return jax.tree.map(
        lambda b, p: jnp.where(mask.reshape((-1,) + (1,) * (p.ndim - 1)), p, b), best_params, state["params"]
    )


def final_metrics(evaluator: Evaluator, params, rest, head, phases=None) -> list[dict[str, float]]:
    """Per seed: val and test metrics; classification adds post-hoc temperature scaling (Guo et al. 2017):
    T fitted on the device on the first ≤ calibration.CALIBRATION_POSITIONS val positions (the number
    used: val/positions_ts), then test/ece_ts, nll_ts and accuracy_ts on the whole test split in its
    evaluation pass. `phases` times and announces each part."""
    phase = phases or _untimed
    classify = head.kind == "classification"

    def announce(split):
        hit = evaluator.last.get(split)
        fresh = hit is None or hit[0] is not params or split == "test" or split.startswith(LENGTH_PREFIX)
        return f"  {split} split ({evaluator.evals[split]['targets'].shape[0]} examples, padded)" if fresh else None

    with phase("final_metrics", announce("val")):
        vals, sample = evaluator.run(params, rest, "val")
    temperature = None
    if classify:
        with phase("final_metrics", f"  temperature fit ({int(np.max(sample[3]))} val positions)"):
            temperature = jax.block_until_ready(evaluator.fit(*sample[:3]))  # timed as its own phase
    with phase("final_metrics", announce("test")):
        tests, _ = evaluator.run(params, rest, "test", temperature)
    out = [{**prefixed("val", v), **prefixed("test", t)} for v, t in zip(vals, tests)]
    for split in evaluator.length_splits:  # task.test_lengths, at the test split's temperature
        with phase("final_metrics", announce(split)):
            at_length, _ = evaluator.run(params, rest, split, temperature)
        for record, metrics in zip(out, at_length):
            record.update(prefixed(split, metrics))
    if classify:
        t_S, count_S = jax.device_get((temperature, sample[3]))
        for i in range(evaluator.num_seeds):
            out[i].update({"test/temperature": float(t_S[i]), "val/positions_ts": float(count_S[i])})
    return out


@jax.jit
def _fit(logits_SNC, labels_SN, weights_SN):
    """calibration.fit_temperature per seed, one seed after another.

    Not vmapped (nor over_seeds): XLA's CPU code for the vmapped Newton loop is slower than one loop per seed at every
    seed count measured (16,384 positions of 2,048 classes: 1.9 against 1.8 s at one seed, 10.0 against 5.4 s at
    three; BENCHMARKS.md).
    """
    return jax.lax.map(lambda sample: calibration.fit_temperature(*sample), (logits_SNC, labels_SN, weights_SN))
