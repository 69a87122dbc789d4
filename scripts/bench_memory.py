#!/usr/bin/env python
"""Peak memory of the compiled train step (XLA memory_analysis, nothing runs) per normalizer.

Protocol and results: BENCHMARKS.md, "Train-step memory". The step is built exactly as
`attnlab.train.fit` builds it (config.assembly.assemble, the same state and training data), on abstract
arguments, and compiled for the CPU:

    JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_memory.py --seq-len 32768 --batch 1 --remat true
"""

from __future__ import annotations

import argparse
import json
import time

GiB = 2**30
NORMALIZERS = ("softmax", "softmax1", "sigmoid", "relu", "squared", "kl", "linear")


def compiled_steps(overrides: list[str], stats: bool):
    """{"plain": compiled, "stats": compiled (if `stats`)} for `python -m attnlab <overrides>` and compile seconds."""
    import tempfile

    import hydra
    import jax
    from flax import nnx

    from attnlab.accelerator import data_mesh
    from attnlab.checkpoint import Checkpoints
    from attnlab.config import registry
    from attnlab.config.assembly import assemble
    from attnlab.model.groups import leaf_groups
    from attnlab.steps import make_stats_step, make_train_step, probes_per_layer
    from attnlab.train import train_data
    from attnlab.train.state import Placement, initial_loop

    with hydra.initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        cfg = hydra.compose("train", overrides=overrides)
    normalizer = next((o.split("=", 1)[1] for o in overrides if o.startswith("normalizer=")), None)
    task, nets, tx, loop = assemble(cfg, cfg.task.default_head, normalizer)
    graphdef, params, _ = nnx.split(nets[0], nnx.Param, ...)
    groups, layers = leaf_groups(params)
    placement = Placement.of(data_mesh(), 1)
    with tempfile.TemporaryDirectory() as tmp:
        state = initial_loop(nets, tx, loop, Checkpoints(tmp), placement).state
    data = train_data(task, placement)
    abstract = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)  # noqa: E731
    state, data = abstract(state), abstract(data)
    common = dict(
        num_layers=len(nets[0].body.blocks),
        num_heads=nets[0].body.blocks[0].attn.num_heads,
        batch_size=loop.batch_size,
        batch_sharding=None,
    )
    # A logging step runs the train step and, beside it, the statistics program (steps.make_stats_step).
    programs = {
        "plain": lambda: make_train_step(graphdef, tx, groups=groups, layers=layers, **common),
        "stats": lambda: make_stats_step(graphdef, probe_layers=probes_per_layer(nets[0]), **common),
    }
    out, seconds = {}, {}
    for kind in ("plain", "stats") if stats else ("plain",):
        t0 = time.perf_counter()
        out[kind] = programs[kind]().lower(state, data).compile()
        seconds[kind] = time.perf_counter() - t0
    return out, seconds


def peak(compiled) -> int:
    """temp + arguments + outputs − aliased (bench_common.peak_bytes)."""
    ma = compiled.memory_analysis()
    return ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes


def measure(normalizer: str, seq_len: int, batch: int, remat: str, model: str, stats: bool, extra=()) -> dict:
    overrides = [
        f"model={model}",
        "task=lm",
        f"task.seq_len={seq_len}",
        f"trainer.batch_size={batch}",
        f"normalizer={normalizer}",
        f"model.remat={remat}",
        "task.n_val=1",
        "task.n_test=1",
        "trainer.eval_batch_size=1",
        *extra,
    ]
    steps, seconds = compiled_steps(overrides, stats)
    row = {"normalizer": normalizer, "T": seq_len, "B": batch, "remat": remat}
    for kind, c in steps.items():
        row[f"{kind}_GiB"] = peak(c) / GiB
        row[f"{kind}_compile_s"] = seconds[kind]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--remat", default="true", help="model.remat: false | true | dots")
    ap.add_argument("--model", default="base")
    ap.add_argument("--normalizers", default=",".join(NORMALIZERS))
    ap.add_argument("--stats", action="store_true", help="also compile the logging step (statistics)")
    ap.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides")
    a = ap.parse_args()
    print("| normalizer | T | B | remat | plain step peak | compile | stats step peak |")
    print("|---|---|---|---|---|---|---|")
    for name in a.normalizers.split(","):
        r = measure(name, a.seq_len, a.batch, a.remat, a.model, a.stats, a.extra)
        st = f"{r['stats_GiB']:.2f} GiB" if "stats_GiB" in r else "–"
        print(
            f"| {name} | {a.seq_len} | {a.batch} | {a.remat} | {r['plain_GiB']:.2f} GiB | "
            f"{r['plain_compile_s']:.0f} s | {st} |",
            flush=True,
        )
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
