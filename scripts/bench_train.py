#!/usr/bin/env python
"""Training-step benchmark: attnlab's compiled step vs a hand-written one, logging cost, compile cache,
vmapped seeds.

Four measurements on the default experiment (`attnlab-train` with no overrides: model=small,
task=mqar, batch 64, softmax attention), each quoted as a median with a ratio, because the
machine this runs on is small and shared. Every timed piece reports wall time and, next to it,
the process CPU time (`time.process_time`, all threads): on a loaded machine the wall time mostly
measures the neighbours, the CPU time the work done.

1. Step time. The compiled training step exactly as `attnlab.train.fit` builds it: the script
   runs `fit`, takes the two AOT-compiled step variants from its `make_train_step(...)
   .lower(state, data).compile()` calls, and stops it before the loop. Against it, a minimal
   step written here in plain JAX + optax: the same pre-LN transformer (token + learned
   positional embedding, qkv/out projections without bias, causal ∧ key-padding mask, softmax
   with the fixed 1/√H scale, GELU MLP, final LayerNorm, linear head), the weighted
   cross-entropy, optax clip + AdamW with the same schedule, decay mask and hyper-parameters,
   params + optimizer state donated, the batch drawn on device from the resident train split
   with the same key scheme. It starts from attnlab's own initial parameters, and the script
   checks that both forwards give the same loss on one batch. Both steps (and attnlab's
   `with_stats=True` variant, run on logging steps) are timed in blocks of --block consecutive
   steps ending in `block_until_ready`, interleaved within each of --rounds rounds (order
   rotated per round); reported: median ms/step, and the median over rounds of the
   within-round ratio attnlab/minimal.
2. Logging cost. The real `fit` for --fit-steps steps with trainer.log_every=50 (the default)
   against log_every > steps (only the unavoidable final step logs); eval_every = steps and
   checkpoint_every = 0 in both, so only the logging differs; runs alternated, --fit-pairs of
   each. Timed: from the start of the loop (after compilation) until the final step's metrics
   are on the host, before the final evaluation (both moments taken from fit's own `Progress`
   calls). Also the main thread's CPU time over the same span (`time.thread_time`: dispatch and
   all host-side logging work; the steps run on XLA's threads), and fit's own `steps_per_sec`
   (whose loop also holds the final evaluation and its compilation).
   Overhead = median loop time with logging / median without − 1.
3. Compilation cache. `python -m attnlab` as a subprocess with compile_cache=<fresh temporary
   directory>, trainer.steps=1, trainer.progress=none (all else default), twice per pair: cold
   (empty cache) then warm. compile_time_s (fit's AOT compile of the two step variants) and
   wall_time_s (the whole of fit) come from each run's metrics.json; the process wall time is
   measured around the subprocess.
4. Vmapped seeds. --vmap-seeds (4) seeds trained as one vmapped program, `python -m attnlab
   trainer.vmap_seeds=4`, against the same seeds as that many sequential single-seed runs,
   `python -m attnlab seed=k` (k = seed..seed+3), each a subprocess with JAX_PLATFORMS=cpu,
   trainer.steps=--vmap-steps (200), eval_every=steps, log_every=50, trainer.progress=none and
   compile_cache=null, so every process really compiles (the compile time is part of what is
   compared). Per repeat the sequential runs are split around the vmapped one (k=0, 1, vmapped,
   k=2, 3) so slow drifts in the machine's load hit both sides. Measured around each
   subprocess: wall time and CPU time (user + system, from resource.getrusage(RUSAGE_CHILDREN)
   deltas); reported: seeds·steps/s = seeds × steps / total wall time, for the vmapped process
   vs the sum of the sequential ones, and the ratio (the same with CPU time). From each run's
   metrics.json (for the vmapped run, each seed's under <run dir>/seed<k>/): compile_time_s,
   wall_time_s (the whole of fit) and steps_per_sec (fit's loop, which also holds the
   evaluation; for the vmapped run × seeds gives seeds·steps/s). The final test loss of each
   seed is compared between the two, a check that both did the same work.

The defaults take six to ten minutes on 2 cores (BENCHMARKS.md records how long). Prints a
Markdown report of the parts run (--skip / --only select them); with --write, which needs all
four, it replaces the "## Training step" section of BENCHMARKS.md (creating the file if needed)
and leaves every other section as it is. Extra arguments are Hydra overrides of
the experiment (trainer.vmap_seeds must stay 1).

    JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_train.py            # print only
    JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_train.py --write    # and update BENCHMARKS.md
    JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_train.py --only vmap   # part 4 alone
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import inspect
import json
import os
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hydra
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import attnlab.train as attnlab_train
from attnlab import registry
from attnlab.accelerator import compute_dtype, configure, data_mesh
from attnlab.cli import build

SECTION = "## Training step (scripts/bench_train.py)"
ROOT = Path(__file__).resolve().parents[1]
GOALS = {"step": 1.05, "logging": 0.03, "cache": 0.3, "vmap": 2.0}
PARTS = ("step", "logging", "cache", "vmap")


def log(msg: str) -> None:
    print(f"[bench_train {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def compose(overrides: list[str]):
    with hydra.initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        return hydra.compose("train", overrides=overrides)


def build_default(overrides: list[str]):
    cfg = compose(overrides)
    head = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("head=")), None)
    task, nets, tx, loop = build(cfg, head or cfg.task.default_head)  # as cli.run picks the head
    net = nets[0] if isinstance(nets, (list, tuple)) else nets  # one net, or one per vmapped seed
    if isinstance(nets, (list, tuple)) and len(nets) != 1:
        raise SystemExit("bench_train times one seed: leave trainer.vmap_seeds at 1")
    return cfg, task, net, tx, loop


def trainer_overrides(cfg, **values) -> list[str]:
    """trainer.key=value for the keys this config has (the trainer group grows over time)."""
    return [f"trainer.{k}={v}" for k, v in values.items() if k in cfg.trainer]


# ---------------------------------------------------------------------------------------------
# fit hooks: the compiled steps fit builds, and the moments its loop starts and reads the last step


class _Captured(Exception):
    """Raised from inside fit once both step variants are compiled."""


@contextlib.contextmanager
def capture_compiled_steps(out: dict):
    """Patch attnlab.train.make_train_step so fit's `.lower(state, data).compile()` results land in
    `out` ({False: plain, True: stats, "state", "data", "compile_s"}), then fit is stopped."""
    real = attnlab_train.make_train_step

    def make(*args, with_stats, **kwargs):
        jitted = real(*args, with_stats=with_stats, **kwargs)

        class Lowerable:
            def lower(self, state, data):
                lowered = jitted.lower(state, data)

                class Compilable:
                    def compile(self):
                        t = time.perf_counter()
                        compiled = lowered.compile()
                        out.setdefault("compile_s", {})[with_stats] = time.perf_counter() - t
                        out[with_stats], out["state"], out["data"] = compiled, state, data
                        if False in out and True in out:
                            raise _Captured
                        return compiled

                return Compilable()

        return Lowerable()

    attnlab_train.make_train_step = make
    try:
        yield out
    finally:
        attnlab_train.make_train_step = real


@contextlib.contextmanager
def loop_clock(total_steps: int, marks: dict):
    """Patch attnlab.train.Progress to record when the loop starts (Progress is built right before
    it) and when the final step's metrics reach the host (its update(step, 0, loss) call)."""
    real = attnlab_train.Progress

    class Clocked(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            marks["start"], marks["cpu_start"], marks["host_start"] = time.perf_counter(), time.process_time(), time.thread_time()

        def update(self, step, n, loss, *a, **k):
            if step == total_steps and loss is not None and "end" not in marks:
                marks["end"], marks["cpu_end"], marks["host_end"] = time.perf_counter(), time.process_time(), time.thread_time()
            return super().update(step, n, loss, *a, **k)

    attnlab_train.Progress = Clocked
    try:
        yield marks
    finally:
        attnlab_train.Progress = real


def call_fit(net, task, tx, loop, run_dir: Path) -> dict:
    """fit on one net with whichever signature it has: (nets, run_dirs, checkpoint_dir), (net, run_dir)
    or (net, summaries); the record of that one run."""
    params = inspect.signature(attnlab_train.fit).parameters
    if "nets" in params:
        return attnlab_train.fit([net], task, tx, loop, mesh=data_mesh(), run_dirs=[run_dir], checkpoint_dir=run_dir)[0]
    if "run_dir" in params:
        return attnlab_train.fit(net, task, tx, loop, mesh=data_mesh(), run_dir=run_dir)
    from attnlab.summaries import Summaries

    summaries = Summaries(str(run_dir))
    try:
        return attnlab_train.fit(net, task, tx, loop, mesh=data_mesh(), summaries=summaries)
    finally:
        summaries.close()


# ---------------------------------------------------------------------------------------------
# the minimal hand-written step


def minimal_params(net) -> dict:
    """attnlab's initial parameters as a plain dict for the hand-written model (β is not a parameter there)."""
    p = nnx.to_pure_dict(nnx.state(net, nnx.Param))
    b = p["body"]
    blocks = []
    for i in range(len(net.body.blocks)):
        blk = b["blocks"][i]
        blocks.append({"ln1": blk["ln1"], "ln2": blk["ln2"], "fc1": blk["fc1"], "fc2": blk["fc2"],
                       "qkv": blk["attn"]["qkv"]["kernel"], "out": blk["attn"]["out"]["kernel"]})
    tree = {"embed": b["embed"]["embedding"], "pos": b["pos"]["embedding"], "blocks": blocks,
            "ln_f": b["ln_f"], "head": p["head"]["proj"]}
    return jax.tree.map(jnp.array, tree)


def make_minimal(cfg, loop, num_heads: int):
    """(loss_fn, jitted step, tx) of the hand-written model; state = (params, opt_state, step, key)."""
    o = cfg.optim

    def layer_norm(x, p, eps=1e-6):
        mean = x.mean(-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]

    def forward(p, inputs, valid):
        B, T = inputs.shape
        D = p["embed"].shape[1]
        H = D // num_heads
        x = p["embed"][inputs] + p["pos"][:T][None]
        mask = jnp.tril(jnp.ones((T, T), bool))[None, None] & valid[:, None, None, :]
        for blk in p["blocks"]:
            q, k, v = (layer_norm(x, blk["ln1"]) @ blk["qkv"]).reshape(B, T, 3, num_heads, H).transpose(2, 0, 1, 3, 4)
            s = jnp.einsum("btnh,bsnh->bnts", q, k) * (1.0 / np.sqrt(H))
            a = jax.nn.softmax(jnp.where(mask, s, jnp.finfo(s.dtype).min), axis=-1)
            x = x + jnp.einsum("bnts,bsnh->btnh", a, v).reshape(B, T, D) @ blk["out"]
            h = jax.nn.gelu(layer_norm(x, blk["ln2"]) @ blk["fc1"]["kernel"] + blk["fc1"]["bias"])
            x = x + h @ blk["fc2"]["kernel"] + blk["fc2"]["bias"]
        return layer_norm(x, p["ln_f"]) @ p["head"]["kernel"] + p["head"]["bias"]

    def loss_fn(p, batch):
        logits = forward(p, batch["inputs"], batch["valid"])
        nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, batch["targets"][..., None], -1)[..., 0]
        w = batch["weights"]
        return (w * nll).sum() / jnp.maximum(w.sum(), 1.0)

    sched = optax.warmup_cosine_decay_schedule(0.0, o.lr, max(o.warmup_steps, 1), max(loop.steps, o.warmup_steps + 1),
                                               end_value=o.lr * o.final_fraction)

    def make_tx(params):
        return optax.chain(optax.clip_by_global_norm(o.clip_norm),
                           optax.adamw(sched, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay,
                                       mask=jax.tree.map(lambda a: a.ndim >= 2, params)))

    def make_step(tx):
        def step(state, data):
            params, opt_state, i, key = state
            idx = jax.random.randint(jax.random.fold_in(key, i), (loop.batch_size,), 0, data["targets"].shape[0])
            batch = jax.tree.map(lambda a: a[idx], data)
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state, i + 1, key), loss

        return jax.jit(step, donate_argnums=0)

    return loss_fn, make_tx, make_step


def attnlab_loss(net, batch):
    feats, _ = net.body(batch["inputs"], batch["valid"])
    return net.head.loss(net.head(feats), batch["targets"], batch["weights"])


# ---------------------------------------------------------------------------------------------
# 1. step time


def bench_steps(args, overrides):
    log("building the default experiment and capturing fit's compiled steps ...")
    cfg, task, net, tx, loop = build_default(overrides)
    dtype = compute_dtype(cfg.accelerator.dtype)
    mparams = minimal_params(net)  # before fit: the initial parameters
    cap: dict = {}
    with tempfile.TemporaryDirectory() as tmp, capture_compiled_steps(cap):
        try:
            call_fit(net, task, tx, loop, Path(tmp))
            raise RuntimeError("fit finished without compiling both step variants; the capture hook no longer matches")
        except _Captured:
            pass
    plain, stats, state, data = cap[False], cap[True], cap["state"], cap["data"]
    log(f"attnlab steps compiled in {cap['compile_s'][False]:.1f}s (plain) + {cap['compile_s'][True]:.1f}s (stats)")

    num_heads = net.body.blocks[0].attn.num_heads
    loss_fn, make_tx, make_step = make_minimal(cfg, loop, num_heads)
    mtx = make_tx(mparams)
    mstate = (mparams, mtx.init(mparams), jnp.zeros((), jnp.int32), jax.random.key(loop.seed))
    t = time.perf_counter()
    mstep = make_step(mtx).lower(mstate, data).compile()
    m_compile = time.perf_counter() - t

    # Same function: both forwards on the first 64 training examples from the same parameters.
    batch = jax.tree.map(lambda a: a[: loop.batch_size], data)
    l_attn = float(jax.jit(attnlab_loss)(net, batch))
    l_min = float(jax.jit(loss_fn)(mparams, batch))

    # A separate stats state so that each variant keeps its own donated state chain.
    stats_state = jax.tree.map(jnp.copy, state)
    runners = {
        "attnlab": [plain, state],
        "attnlab_stats": [stats, stats_state],
        "minimal": [mstep, mstate],
    }

    def run_block(name: str, n: int) -> float:
        fn, st = runners[name]
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            st, _ = fn(st, data)
        jax.block_until_ready(st)
        runners[name][1] = st
        cpu[name].append((time.process_time() - c0) / n * 1e3)
        return (time.perf_counter() - t0) / n * 1e3

    names = list(runners)
    cpu: dict = {n: [] for n in names}
    for name in names:  # warm-up: first executions, allocator, caches
        run_block(name, max(args.block // 5, 3))
    times = {n: [] for n in names}
    cpu = {n: [] for n in names}
    log(f"timing {args.rounds} rounds × {args.block} steps per variant ...")
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        if r % 2:
            order = order[::-1]
        for name in order:
            times[name].append(run_block(name, args.block))
    def paired(x, y, series):
        return [u / v for u, v in zip(series[x], series[y])]

    res = {
        "ms": {n: statistics.median(v) for n, v in times.items()},
        "cpu_ms": {n: statistics.median(v) for n, v in cpu.items()},
        "spread": {n: (max(v) - min(v)) / statistics.median(v) for n, v in times.items()},
        "cpu_spread": {n: (max(v) - min(v)) / statistics.median(v) for n, v in cpu.items()},
        # the per-round ratio (the variants ran back to back), median over rounds
        "ratio": statistics.median(paired("attnlab", "minimal", times)),
        "ratio_range": (min(paired("attnlab", "minimal", times)), max(paired("attnlab", "minimal", times))),
        "cpu_ratio": statistics.median(paired("attnlab", "minimal", cpu)),
        "cpu_ratio_range": (min(paired("attnlab", "minimal", cpu)), max(paired("attnlab", "minimal", cpu))),
        "stats_cpu_ratio": statistics.median(paired("attnlab_stats", "attnlab", cpu)),
        "loss": (l_attn, l_min),
        "compile": {"attnlab": cap["compile_s"][False], "attnlab_stats": cap["compile_s"][True], "minimal": m_compile},
        "dtype": str(np.dtype(dtype)), "batch": loop.batch_size, "seq_len": task.seq_len,
        "model": {k: cfg.model[k] for k in ("d_model", "heads", "layers", "mlp_ratio")},
        "times": times, "cpu": cpu,
    }
    log(f"attnlab {res['ms']['attnlab']:.1f} ms (cpu {res['cpu_ms']['attnlab']:.1f}), minimal {res['ms']['minimal']:.1f} ms "
        f"(cpu {res['cpu_ms']['minimal']:.1f}); ratio {res['ratio']:.3f} (cpu {res['cpu_ratio']:.3f})")
    return res


# ---------------------------------------------------------------------------------------------
# 2. logging cost


def bench_logging(args, overrides, default_log_every: int):
    base = compose(overrides)
    steps = args.fit_steps or base.trainer.steps
    common = trainer_overrides(base, steps=steps, eval_every=steps, checkpoint_every=0, progress="none")
    variants = {"log": common + [f"trainer.log_every={default_log_every}"],
                "nolog": common + [f"trainer.log_every={steps + 1}"]}
    runs = {k: [] for k in variants}
    order = []
    for i in range(args.fit_pairs):
        order += ["log", "nolog"] if i % 2 == 0 else ["nolog", "log"]
    # One task / optimizer / initial parameters for all runs; only the loop config differs.
    loops = {}
    for name, extra in variants.items():
        _, task, net, tx, loops[name] = build_default(overrides + extra)
    graphdef, pristine = nnx.split(net)
    for name in order:
        marks: dict = {}
        fresh = nnx.merge(graphdef, jax.tree.map(jnp.copy, pristine))  # fit donates the arrays it starts from
        with tempfile.TemporaryDirectory() as tmp, loop_clock(steps, marks):
            out = call_fit(fresh, task, tx, loops[name], Path(tmp))
        if out.get("status") != "completed":
            raise RuntimeError(f"fit {name}: {out.get('status')} {out.get('error')}")
        if not {"start", "end"} <= set(marks):
            raise RuntimeError("fit no longer builds attnlab.train.Progress / calls update(steps, 0, loss); "
                               "the loop clock hook needs updating")
        loop_s, cpu_s = marks["end"] - marks["start"], marks["cpu_end"] - marks["cpu_start"]
        host_s = marks["host_end"] - marks["host_start"]
        runs[name].append({"loop_s": loop_s, "cpu_s": cpu_s, "host_s": host_s, "steps_per_sec": out["steps_per_sec"],
                           "compile_s": out["compile_time_s"], "wall_s": out["wall_time_s"]})
        log(f"fit {name}: loop {loop_s:.2f}s (cpu {cpu_s:.2f}s, main thread {host_s:.2f}s) for {steps} steps "
            f"({steps / loop_s:.1f} steps/s); fit's steps_per_sec {out['steps_per_sec']:.1f}; "
            f"compile {out['compile_time_s']:.1f}s")
    med = {k: statistics.median(r["loop_s"] for r in v) for k, v in runs.items()}
    med_cpu = {k: statistics.median(r["cpu_s"] for r in v) for k, v in runs.items()}
    med_host = {k: statistics.median(r["host_s"] for r in v) for k, v in runs.items()}
    med_sps = {k: statistics.median(r["steps_per_sec"] for r in v) for k, v in runs.items()}
    pairs = [a["loop_s"] / b["loop_s"] - 1 for a, b in zip(runs["log"], runs["nolog"])]
    return {"steps": steps, "runs": runs, "loop_s": med, "fit_sps": med_sps, "cpu_s": med_cpu, "host_s": med_host,
            "cpu_overhead": med_cpu["log"] / med_cpu["nolog"] - 1,
            "cpu_overhead_pairs": [a["cpu_s"] / b["cpu_s"] - 1 for a, b in zip(runs["log"], runs["nolog"])],
            "overhead": med["log"] / med["nolog"] - 1, "overhead_pairs": pairs,
            # how far apart runs of the *same* config are: the yardstick for the wall-time overhead
            "repeat_spread": max((max(r["loop_s"] for r in v) - min(r["loop_s"] for r in v)) / statistics.median(r["loop_s"] for r in v)
                                 for v in runs.values()),
            "overhead_fit_sps": med_sps["nolog"] / med_sps["log"] - 1,
            "log_every": default_log_every,
            "n_logs": sum(1 for i in range(1, steps + 1) if i % default_log_every == 0 or i == steps)}


# ---------------------------------------------------------------------------------------------
# 3. compilation cache


def bench_cache(args, overrides):
    results = []
    for pair in range(args.cache_pairs):
        with tempfile.TemporaryDirectory(prefix="attnlab_bench_cache_") as tmp:
            cache = Path(tmp) / "jax_cache"
            row = {}
            for kind in ("cold", "warm"):
                run_dir = Path(tmp) / kind
                cmd = [sys.executable, "-m", "attnlab", *overrides, f"compile_cache={cache}", "trainer.steps=1",
                       "trainer.progress=none", f"hydra.run.dir={run_dir}"]
                t = time.perf_counter()
                proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                wall = time.perf_counter() - t
                if proc.returncode != 0:
                    raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
                m = json.loads((run_dir / "metrics.json").read_text())
                n_files = sum(1 for p in cache.rglob("*") if p.is_file())
                row[kind] = {"compile_s": m["compile_time_s"], "fit_s": m["wall_time_s"], "process_s": wall,
                             "cache_files": n_files}
                log(f"cache pair {pair + 1} {kind}: compile {m['compile_time_s']:.2f}s, fit {m['wall_time_s']:.2f}s, "
                    f"process {wall:.2f}s, {n_files} cache files")
            results.append(row)
    med = {kind: {k: statistics.median(r[kind][k] for r in results) for k in ("compile_s", "fit_s", "process_s")}
           for kind in ("cold", "warm")}
    ratios = {k: statistics.median(r["warm"][k] / r["cold"][k] for r in results) for k in ("compile_s", "fit_s", "process_s")}
    return {"pairs": results, "median": med, "ratio": ratios,
            "command": " ".join(["python -m attnlab", *map(shlex.quote, overrides), "compile_cache=<fresh tmp dir>",
                                 "trainer.steps=1", "trainer.progress=none", "hydra.run.dir=<tmp dir>"])}


# ---------------------------------------------------------------------------------------------
# 4. vmapped seeds vs sequential runs


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_attnlab(args: list[str], run_dir: Path) -> dict:
    """`python -m attnlab *args` with JAX_PLATFORMS=cpu in run_dir: its wall and CPU time."""
    cmd = [sys.executable, "-m", "attnlab", *args, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    c0, t0 = children_cpu_s(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - c0
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall_s": wall, "cpu_s": cpu}


def fit_numbers(metrics_file: Path) -> dict:
    m = json.loads(metrics_file.read_text())
    if m.get("status") != "completed":
        raise RuntimeError(f"{metrics_file}: {m.get('status')} {m.get('error')}")
    return {"compile_s": m["compile_time_s"], "fit_s": m["wall_time_s"], "steps_per_sec": m["steps_per_sec"],
            "test_loss": m["final"]["test/loss"], "vmapped_seeds": m.get("vmapped_seeds", 1)}


def bench_vmap(args, overrides):
    S, steps = args.vmap_seeds, args.vmap_steps
    base = compose(overrides)
    seed0 = int(base.seed)
    seeds = [seed0 + k for k in range(S)]
    common = [o for o in overrides if not o.startswith("seed=")]
    common += trainer_overrides(base, steps=steps, eval_every=steps, log_every=50, progress="none")
    common += ["compile_cache=null"]
    repeats = []
    for rep in range(args.vmap_repeats):
        with tempfile.TemporaryDirectory(prefix="attnlab_bench_vmap_") as tmp:
            order = [("seq", s) for s in seeds[: S // 2]] + [("vmap", None)] + [("seq", s) for s in seeds[S // 2:]]
            seq, vm = {}, None
            for kind, s in order:
                if kind == "seq":
                    run_dir = Path(tmp) / f"seq_seed{s}"
                    r = run_attnlab([*common, f"seed={s}", "trainer.vmap_seeds=1"], run_dir)
                    r.update(fit_numbers(run_dir / "metrics.json"))
                    seq[s] = r
                    log(f"vmap repeat {rep + 1}: seed={s} alone: process {r['wall_s']:.1f}s wall, {r['cpu_s']:.1f}s CPU; "
                        f"compile {r['compile_s']:.1f}s, fit {r['fit_s']:.1f}s, {r['steps_per_sec']:.2f} steps/s")
                else:
                    run_dir = Path(tmp) / "vmapped"
                    vm = run_attnlab([*common, f"seed={seed0}", f"trainer.vmap_seeds={S}"], run_dir)
                    per = {s2: fit_numbers(run_dir / f"seed{s2}" / "metrics.json") for s2 in seeds}
                    if any(p["vmapped_seeds"] != S for p in per.values()):
                        raise RuntimeError(f"the vmapped run did not train {S} seeds in one program: {per}")
                    first = per[seeds[0]]
                    vm.update({k: first[k] for k in ("compile_s", "fit_s", "steps_per_sec")},
                              test_loss={s2: p["test_loss"] for s2, p in per.items()})
                    log(f"vmap repeat {rep + 1}: {S} seeds vmapped: process {vm['wall_s']:.1f}s wall, "
                        f"{vm['cpu_s']:.1f}s CPU; compile {vm['compile_s']:.1f}s, fit {vm['fit_s']:.1f}s, "
                        f"{vm['steps_per_sec']:.2f} steps/s")
        tot = {k: sum(r[k] for r in seq.values()) for k in ("wall_s", "cpu_s", "compile_s", "fit_s")}
        row = {"seq": seq, "seq_total": tot, "vmap": vm,
               "ratio_wall": tot["wall_s"] / vm["wall_s"], "ratio_cpu": tot["cpu_s"] / vm["cpu_s"],
               "ratio_fit": tot["fit_s"] / vm["fit_s"],
               # fit's loop alone (no compile): vmapped seeds·steps/s over a single run's steps/s
               "ratio_loop": S * vm["steps_per_sec"] / statistics.mean(r["steps_per_sec"] for r in seq.values()),
               "loss_diff": max(abs(vm["test_loss"][s] - seq[s]["test_loss"]) for s in seeds)}
        log(f"vmap repeat {rep + 1}: sequential {tot['wall_s']:.1f}s wall / {tot['cpu_s']:.1f}s CPU vs vmapped "
            f"{vm['wall_s']:.1f}s / {vm['cpu_s']:.1f}s: {row['ratio_wall']:.2f}× wall, {row['ratio_cpu']:.2f}× CPU")
        repeats.append(row)
    med = lambda f: statistics.median(f(r) for r in repeats)  # noqa: E731
    return {
        "seeds": S, "steps": steps, "repeats": repeats,
        "seq_wall_s": med(lambda r: r["seq_total"]["wall_s"]), "vmap_wall_s": med(lambda r: r["vmap"]["wall_s"]),
        "seq_cpu_s": med(lambda r: r["seq_total"]["cpu_s"]), "vmap_cpu_s": med(lambda r: r["vmap"]["cpu_s"]),
        "seq_compile_s": med(lambda r: r["seq_total"]["compile_s"]), "vmap_compile_s": med(lambda r: r["vmap"]["compile_s"]),
        "seq_fit_s": med(lambda r: r["seq_total"]["fit_s"]), "vmap_fit_s": med(lambda r: r["vmap"]["fit_s"]),
        "seq_sps": med(lambda r: statistics.mean(x["steps_per_sec"] for x in r["seq"].values())),
        "vmap_sps": med(lambda r: r["vmap"]["steps_per_sec"]),
        "ratio_wall": med(lambda r: r["ratio_wall"]), "ratio_cpu": med(lambda r: r["ratio_cpu"]),
        "ratio_fit": med(lambda r: r["ratio_fit"]), "ratio_loop": med(lambda r: r["ratio_loop"]),
        "loss_diff": max(r["loss_diff"] for r in repeats),
        "command": " ".join(["python -m attnlab", *map(shlex.quote, common), "trainer.vmap_seeds=<4 | 1 with seed=k>",
                             "hydra.run.dir=<tmp dir>"]),
    }


# ---------------------------------------------------------------------------------------------
# report


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    devs = ", ".join(sorted({d.platform for d in jax.devices()}))
    return f"`nproc` = {nproc} ({cpu}); JAX backend: {devs}"


def command_line() -> str:
    env = f"JAX_PLATFORMS={os.environ['JAX_PLATFORMS']} " if "JAX_PLATFORMS" in os.environ else ""
    script = os.path.relpath(Path(sys.argv[0]).resolve(), ROOT)
    return f"{env}.venv/bin/python {shlex.join([script, *sys.argv[1:]])}"


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def report(args, st, lg, ca, vm, load: str, elapsed: float) -> str:
    """Markdown for the parts that ran (None: skipped)."""
    import flax

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    L = [SECTION, ""]
    L.append("The default experiment (model=small, task=mqar, batch 64, softmax attention), all four measured "
             "in one run; see the script's docstring for the protocol. Wall time is what was asked for; on a "
             "shared machine it mostly measures the neighbours, so the CPU time (all threads: "
             "`time.process_time` in process, `getrusage` for subprocesses) of the same work is given next to "
             "it: it is the steadier measure of the work each variant does.")
    L.append("")
    L.append(f"- Date: {now}")
    L.append(f"- Machine: {machine_line()}{load}")
    L.append(f"- Python {platform.python_version()}, jax {jax.__version__}, flax {flax.__version__}, "
             f"optax {optax.__version__}")
    L.append(f"- Command: `{command_line()}` (took {elapsed / 60:.1f} min)")
    L.append("")
    L.append("| measurement | attnlab | reference | ratio | goal | |")
    L.append("|---|---:|---:|---:|---:|---|")
    if st:
        r, rc = st["ratio"], st["cpu_ratio"]
        L.append(f"| train step, wall ms/step (median of {args.rounds} blocks × {args.block} steps) "
                 f"| {st['ms']['attnlab']:.1f} | {st['ms']['minimal']:.1f} (minimal JAX step) "
                 f"| {r:.3f}× | ≤ {GOALS['step']:.2f}× | {verdict(r <= GOALS['step'])} |")
        L.append(f"| train step, CPU ms/step (same blocks) | {st['cpu_ms']['attnlab']:.1f} | {st['cpu_ms']['minimal']:.1f} "
                 f"| {rc:.3f}× | ≤ {GOALS['step']:.2f}× | {verdict(rc <= GOALS['step'])} |")
    if lg:
        o, oc, noise = lg["overhead"], lg["cpu_overhead"], lg["repeat_spread"]
        wall_verdict = verdict(o <= GOALS["logging"])
        if abs(o) < noise and noise > 2 * GOALS["logging"]:
            wall_verdict = f"unresolved: runs of the same config differ by up to {noise:.0%}"
        L.append(f"| `fit`, {lg['steps']} steps, loop wall s (median of {args.fit_pairs}) "
                 f"| {lg['loop_s']['log']:.2f} (log_every={lg['log_every']}) | {lg['loop_s']['nolog']:.2f} (final step only) "
                 f"| {o:+.1%} | ≤ +{GOALS['logging']:.0%} | {wall_verdict} |")
        L.append(f"| `fit`, same loops, CPU s | {lg['cpu_s']['log']:.2f} | {lg['cpu_s']['nolog']:.2f} "
                 f"| {oc:+.1%} | ≤ +{GOALS['logging']:.0%} | {verdict(oc <= GOALS['logging'])} |")
    if ca:
        c = ca["ratio"]["compile_s"]
        L.append(f"| compile_time_s, trainer.steps=1 (median of {args.cache_pairs}) "
                 f"| {ca['median']['warm']['compile_s']:.2f} (warm cache) | {ca['median']['cold']['compile_s']:.2f} (cold cache) "
                 f"| {c:.2f}× | ≤ {GOALS['cache']:.1f}× | {verdict(c <= GOALS['cache'])} |")
        L.append(f"| fit wall_time_s, trainer.steps=1 | {ca['median']['warm']['fit_s']:.2f} (warm) "
                 f"| {ca['median']['cold']['fit_s']:.2f} (cold) | {ca['ratio']['fit_s']:.2f}× | | |")
        L.append(f"| `python -m attnlab` process wall s | {ca['median']['warm']['process_s']:.2f} (warm) "
                 f"| {ca['median']['cold']['process_s']:.2f} (cold) | {ca['ratio']['process_s']:.2f}× | | |")
    if vm:
        S, n = vm["seeds"], vm["seeds"] * vm["steps"]
        reps = f"median of {args.vmap_repeats}" if args.vmap_repeats > 1 else "1 repeat"
        rw, rc = vm["ratio_wall"], vm["ratio_cpu"]
        L.append(f"| {S} seeds × {vm['steps']} steps, process wall, seeds·steps/s ({reps}) "
                 f"| {n / vm['vmap_wall_s']:.2f} (vmap_seeds={S}: {vm['vmap_wall_s']:.1f} s) "
                 f"| {n / vm['seq_wall_s']:.2f} ({S} sequential runs: {vm['seq_wall_s']:.1f} s) "
                 f"| {rw:.2f}× | ≥ {GOALS['vmap']:.0f}× | {verdict(rw >= GOALS['vmap'])} |")
        # CPU time measures the work, not the throughput: the goal is on wall time (what a user waits for),
        # and the CPU row says how much of the gain is less work rather than more cores kept busy.
        L.append(f"| same processes, CPU s (seeds·steps per CPU s) "
                 f"| {vm['vmap_cpu_s']:.1f} ({n / vm['vmap_cpu_s']:.2f}) | {vm['seq_cpu_s']:.1f} ({n / vm['seq_cpu_s']:.2f}) "
                 f"| {rc:.2f}× | | |")
        L.append(f"| same processes, cores busy on average (CPU s / wall s) | {vm['vmap_cpu_s'] / vm['vmap_wall_s']:.2f} "
                 f"| {vm['seq_cpu_s'] / vm['seq_wall_s']:.2f} | | | |")
        L.append(f"| compile_time_s (metrics.json) | {vm['vmap_compile_s']:.1f} (once) | {vm['seq_compile_s']:.1f} "
                 f"(sum of {S}) | {vm['seq_compile_s'] / vm['vmap_compile_s']:.2f}× | | |")
        L.append(f"| fit wall_time_s (metrics.json) | {vm['vmap_fit_s']:.1f} | {vm['seq_fit_s']:.1f} (sum of {S}) "
                 f"| {vm['ratio_fit']:.2f}× | | |")
        L.append(f"| fit loop, seeds·steps/s (steps_per_sec × seeds) | {S * vm['vmap_sps']:.2f} "
                 f"({vm['vmap_sps']:.2f} × {S}) | {vm['seq_sps']:.2f} (mean of {S} runs) | {vm['ratio_loop']:.2f}× | | |")
    L.append("")
    if st:
        lo, hi = st["ratio_range"]
        clo, chi = st["cpu_ratio_range"]
        L.append(
            f"Step: ratios are medians over rounds of attnlab/minimal within a round; range over rounds "
            f"{lo:.2f}–{hi:.2f} (wall), {clo:.3f}–{chi:.3f} (CPU). Block spread (max−min)/median, wall / CPU: "
            + ", ".join(f"{n} {st['spread'][n]:.0%} / {st['cpu_spread'][n]:.0%}" for n in st["spread"])
            + f". attnlab's `with_stats=True` step (run on logging steps): {st['ms']['attnlab_stats']:.1f} ms wall, "
            f"{st['cpu_ms']['attnlab_stats']:.1f} ms CPU ({st['stats_cpu_ratio']:.2f}× the plain step's CPU). "
            f"Compile: attnlab {st['compile']['attnlab']:.1f} s (plain) + {st['compile']['attnlab_stats']:.1f} s (stats), "
            f"minimal {st['compile']['minimal']:.1f} s. Same function: loss on one batch from the same initial parameters "
            f"{st['loss'][0]:.6f} (attnlab) vs {st['loss'][1]:.6f} (minimal). Shapes: B={st['batch']}, T={st['seq_len']}, "
            + ", ".join(f"{k}={v}" for k, v in st["model"].items()) + f", {st['dtype']}."
        )
        L.append("")
    if lg:
        n_extra = lg["n_logs"] - 1
        expected = (f" Expected from the step CPU times alone (a `with_stats` step every {lg['log_every']}): "
                    f"{(st['stats_cpu_ratio'] - 1) / lg['log_every']:+.2%}." if st else "")
        L.append(
            f"Logging: {lg['n_logs']} logging steps in {lg['steps']} vs 1 (the final step), i.e. {n_extra} extra; "
            f"eval_every={lg['steps']} and checkpoint_every=0 in both. Loop wall s per run, log: "
            + ", ".join(f"{r['loop_s']:.2f}" for r in lg["runs"]["log"]) + "; no-log: "
            + ", ".join(f"{r['loop_s']:.2f}" for r in lg["runs"]["nolog"])
            + f" (same-config runs differ by up to {lg['repeat_spread']:.0%}). Per pair (log vs no-log): wall "
            + ", ".join(f"{p:+.1%}" for p in lg["overhead_pairs"]) + "; CPU "
            + ", ".join(f"{p:+.1%}" for p in lg["cpu_overhead_pairs"])
            + f". Main-thread CPU (`time.thread_time`: dispatch, device_get, metric flattening, TensorBoard writes; "
            f"the steps themselves run on XLA's threads): {lg['host_s']['log']:.3f} s vs {lg['host_s']['nolog']:.3f} s. "
            f"fit's own steps_per_sec (its loop also holds the final evaluation and that program's compilation): "
            f"{lg['fit_sps']['log']:.2f} vs {lg['fit_sps']['nolog']:.2f}.{expected}"
        )
        L.append("")
    if ca:
        per = "; ".join(f"pair {i + 1}: compile cold {p['cold']['compile_s']:.2f} s / warm {p['warm']['compile_s']:.2f} s, "
                        f"process {p['cold']['process_s']:.1f} / {p['warm']['process_s']:.1f} s"
                        for i, p in enumerate(ca["pairs"]))
        L.append(f"Cache: `{ca['command']}`, cold then warm in the same fresh cache directory; {per}. "
                 f"compile_time_s is fit's `lower().compile()` of the two step variants; a warm cache skips the XLA "
                 f"compilation but not tracing and lowering.")
        L.append("")
    if vm:
        S = vm["seeds"]
        per = "; ".join(
            f"repeat {i + 1}: sequential " + " + ".join(f"{x['wall_s']:.1f}" for x in r["seq"].values())
            + f" = {r['seq_total']['wall_s']:.1f} s wall ({r['seq_total']['cpu_s']:.1f} s CPU) vs vmapped "
            f"{r['vmap']['wall_s']:.1f} s ({r['vmap']['cpu_s']:.1f} s CPU): {r['ratio_wall']:.2f}× wall, "
            f"{r['ratio_cpu']:.2f}× CPU"
            for i, r in enumerate(vm["repeats"]))
        L.append(
            f"Vmapped seeds: `{vm['command']}`, each a subprocess with JAX_PLATFORMS=cpu, the sequential runs "
            f"seed=k one at a time (split around the vmapped run); ratio = sequential total / vmapped, i.e. the "
            f"vmapped run's throughput in seeds·steps/s over the sequential runs'; the goal is on wall time, the "
            f"CPU time (user + system of the subprocess, `getrusage(RUSAGE_CHILDREN)`) separates less work from more "
            f"cores kept busy. Per process: {per}. "
            f"Where it comes from, per fit's metrics.json: compile (both step variants, no cache) "
            f"{vm['vmap_compile_s']:.1f} s once vs {vm['seq_compile_s']:.1f} s over {S} runs; fit's loop (steps "
            f"and the final evaluation, no compile of the steps) {S * vm['vmap_sps']:.2f} vs {vm['seq_sps']:.2f} "
            f"seeds·steps/s ({vm['ratio_loop']:.2f}×); the rest of each process (Python and JAX start-up, the "
            f"task's data, evaluation programs, checkpoint) is paid once vs {S} times. Same work: the final test "
            f"loss of each seed differs by at most {vm['loss_diff']:.1e} between the vmapped and the single-seed "
            f"runs."
        )
        L.append("")
    return "\n".join(L)


def write_section(text: str, path: Path):
    """Replace the section from SECTION to the next '## ' heading (or EOF); create the file if needed."""
    body = text.rstrip("\n") + "\n"
    if not path.exists():
        path.write_text("# Benchmarks\n\n" + body)
        return
    lines = path.read_text().splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.rstrip("\n") == SECTION), None)
    if start is None:
        path.write_text("".join(lines).rstrip("\n") + "\n\n" + body)
        return
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"## ", lines[i])), len(lines))
    tail = lines[end:]
    path.write_text("".join(lines[:start]) + body + ("\n" + "".join(tail) if tail else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--block", type=int, default=20, help="consecutive steps per timed block")
    p.add_argument("--rounds", type=int, default=6, help="timed blocks per step variant (interleaved)")
    p.add_argument("--fit-steps", type=int, default=150, help="steps per fit run (0: trainer.steps of the config)")
    p.add_argument("--fit-pairs", type=int, default=2, help="fit runs with and without logging, each")
    p.add_argument("--cache-pairs", type=int, default=1, help="cold/warm subprocess pairs")
    p.add_argument("--vmap-seeds", type=int, default=4, help="seeds in the vmapped-vs-sequential comparison")
    p.add_argument("--vmap-steps", type=int, default=200, help="trainer.steps of each run in that comparison")
    p.add_argument("--vmap-repeats", type=int, default=1, help="vmapped run + sequential runs, repeated")
    p.add_argument("--skip", default="", help=f"comma-separated parts to skip: {', '.join(PARTS)}")
    p.add_argument("--only", default="", help="comma-separated parts to run (default: all)")
    p.add_argument("--write", action="store_true", help=f"update '{SECTION}' in BENCHMARKS.md")
    p.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md", help="file updated by --write")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for the experiment (default: none)")
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cfg = compose(args.overrides)
    # As the CLI does: platform, devices and a persistent compilation cache (a private temporary one
    # here, so repeated fit runs compile once without touching the user's cache).
    cache_tmp = tempfile.TemporaryDirectory(prefix="attnlab_bench_inproc_")
    configure(cfg.accelerator.platform, cfg.accelerator.devices, cache_tmp.name, cfg.accelerator.gpu_memory_fraction)
    skip = {s for s in args.skip.split(",") if s}
    only = {s for s in args.only.split(",") if s}
    if not (skip | only) <= set(PARTS):
        p.error(f"unknown part(s) {sorted((skip | only) - set(PARTS))}; parts: {', '.join(PARTS)}")
    run = [x for x in PARTS if x not in skip and (not only or x in only)]
    if args.write and len(run) < len(PARTS):
        p.error("--write replaces the whole section: run all parts (no --skip / --only)")
    st = bench_steps(args, args.overrides) if "step" in run else None
    lg = bench_logging(args, args.overrides, cfg.trainer.log_every) if "logging" in run else None
    ca = bench_cache(args, args.overrides) if "cache" in run else None
    vm = bench_vmap(args, args.overrides) if "vmap" in run else None
    elapsed = time.perf_counter() - t_start
    load = f"; 1-min load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end" if load0 is not None else ""
    text = report(args, st, lg, ca, vm, load, elapsed)
    print(text)
    if args.write:
        write_section(text, args.output)
        log(f"wrote {args.output}")

if __name__ == "__main__":
    main()
