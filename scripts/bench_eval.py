#!/usr/bin/env python
"""Evaluation-side benchmarks, each variant pair interleaved in one run (BENCHMARKS.md, "Evaluation and the head"):

1. the head at the scored positions (steps.scored) against the head at every position: MQAR's loss and
   gradients at vocab_size 64 and 8192 (zoology's), model d_model=128, heads=1, B=64;
2. an eval step with its images (evaluate_step: val pass, attention maps, continuation, the hand-off of
   images and histograms to the writer's thread) against the val pass alone, task=lm seq_len=1024.

    JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_eval.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import tempfile

import jax
import jax.numpy as jnp
from bench_common import clock, interleave, load_average, med, paired_ratio, seconds, since, table
from flax import nnx
from hydra import compose, initialize_config_dir

from attnlab.config import assembly, registry


def built(*overrides: str):
    with initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    return assembly.assemble(cfg, cfg.task.default_head)


def timed(fn):
    def sample():
        start = clock()
        jax.block_until_ready(fn())
        return since(start)

    return sample


def head_rows(rounds: int) -> list[list]:
    from attnlab.steps import loss_of_batch

    rows = []
    for vocab in (64, 8192):
        task, nets, _, _ = built(
            "task=mqar",
            f"task.vocab_size={vocab}",
            "task.n_train=2000",
            "task.n_val=100",
            "task.n_test=100",
            "model.d_model=128",
            "model.heads=1",
        )
        graphdef, params, rest = nnx.split(nets[0], nnx.Param, ...)
        split = task.splits["train"]
        batch = {k: jnp.asarray(getattr(split, k)[:64]) for k in ("inputs", "targets", "weights", "valid")}
        programs, flops = {}, {}
        for name, k in (("every position", None), ("scored positions", task.scored_positions())):
            loss = loss_of_batch(graphdef, {"rest": rest}, batch, jax.random.key(0), with_stats=False, scored_k=k)
            programs[name] = (
                jax.jit(lambda p, loss=loss: jax.value_and_grad(loss, has_aux=True)(p, None)).lower(params).compile()
            )
            cost = programs[name].cost_analysis()
            flops[name] = (cost[0] if isinstance(cost, list) else cost).get("flops", float("nan"))
        samples = interleave({n: timed(lambda c=c, params=params: c(params)) for n, c in programs.items()}, rounds)
        a, b = samples["every position"], samples["scored positions"]
        rows.append(
            [
                vocab,
                task.scored_positions(),
                task.seq_len,
                f"{flops['every position'] / 1e9:.2f} / {flops['scored positions'] / 1e9:.2f}",
                f"{seconds(med([x[0] for x in a]))} / {seconds(med([x[0] for x in b]))}",
                f"{seconds(med([x[1] for x in a]))} / {seconds(med([x[1] for x in b]))}",
                paired_ratio([x[0] for x in a], [x[0] for x in b]),
                paired_ratio([x[1] for x in a], [x[1] for x in b]),
            ]
        )
    return rows


def eval_rows(rounds: int) -> list[list]:
    from attnlab.accelerator import data_mesh
    from attnlab.board.summaries import Summaries
    from attnlab.train.evaluation import Evaluator, evaluate_step
    from attnlab.train.state import Placement

    task, nets, _, loop = built("task=lm", "task.seq_len=1024", "model.max_len=1024", "trainer.eval_batch_size=8")
    placement = Placement.of(data_mesh(), 1)
    graphdef, params, rest = nnx.split(nets[0], nnx.Param, ...)
    state = {"params": jax.tree.map(lambda a: a[None], params), "rest": jax.tree.map(lambda a: a[None], rest)}
    evaluator = Evaluator.build(graphdef, task, loop, 1, placement.replicated, head=nets[0].head)
    evaluator = evaluator.compiled(state["params"], state["rest"])
    with tempfile.TemporaryDirectory() as logdir:
        summaries = [Summaries(logdir)]
        best = [{"val/loss": float("inf")}]

        def val_pass():
            evaluator.last.clear()
            return evaluator.run(state["params"], state["rest"], "val")[0]

        def eval_step(wait: bool):
            def run():
                evaluator.last.clear()
                out = evaluate_step(1, state, best, state["params"], evaluator, summaries, None, True)
                if wait:
                    summaries[0].wait()
                return out

            return run

        samples = interleave(
            {
                "val pass": timed(val_pass),
                "eval step": timed(eval_step(False)),
                "eval step + drawing": timed(eval_step(True)),
            },
            rounds,
        )
        summaries[0].close()
    base = samples["val pass"]
    return [
        [
            name,
            f"{evaluator.evals['val']['targets'].shape[0]} × 1024",
            seconds(med([x[0] for x in s])),
            seconds(med([x[1] for x in s])),
            paired_ratio([x[0] for x in s], [x[0] for x in base]),
            paired_ratio([x[1] for x in s], [x[1] for x in base]),
        ]
        for name, s in samples.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"device: {jax.devices()[0].platform} × {jax.device_count()}; load average before: {load_average()}")
    print("\nThe head and loss at the scored positions vs every position (MQAR, loss + gradients, B=64)\n")
    print(
        "\n".join(
            table(
                [
                    "vocab_size",
                    "scored k",
                    "T",
                    "GFLOP all / scored",
                    "wall all / scored",
                    "CPU all / scored",
                    "all/scored wall",
                    "all/scored CPU",
                ],
                head_rows(args.rounds),
            )
        )
    )
    print("\nAn eval step with its images vs the val pass alone (task=lm, seq_len 1024, eval_batch_size 8)\n")
    print(
        "\n".join(
            table(
                ["program", "val windows", "wall", "CPU", "/ val pass wall", "/ val pass CPU"], eval_rows(args.rounds)
            )
        )
    )
    print(f"\nload average after: {load_average()}")


if __name__ == "__main__":
    main()
