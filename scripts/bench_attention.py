#!/usr/bin/env python
"""Every blockwise-capable normalizer, dense vs blockwise: forward+backward time and peak memory vs T.

Program: jax.jit(jax.grad(sum(out · ct))) w.r.t. q, k, v and the normalizer's parameters, causal,
B=1, N=4, H=64, float32 by default; `impl: dense` vs `impl: blockwise` (block_size from
--block-size). Peak memory is XLA's `compiled.memory_analysis()` (temp + arguments + outputs −
aliased), deterministic. Wall time and process CPU time (time.process_time, all threads) per call:
the median of samples taken with dense and blockwise interleaved (so load changes hit both), as many
as fit in --budget seconds per pair, after one warm-up round (a first round over 2 s is kept as the
only sample). Dense runs up to --dense-max-T; above --time-all-max-T only the --timed-at-length
normalizers are timed, up to --time-max-T (the rest: memory only), to keep the run near 10 minutes.

    JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_attention.py [--write]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from bench_common import (
    MiB,
    clock,
    interleave,
    load_average,
    med,
    mib,
    peak_bytes,
    ratio,
    seconds,
    since,
    table,
    write_section,
)
from flax import nnx

from attnlab.backends.impl import Workload
from attnlab.config import normalizer as build
from attnlab.normalizers import Mask

SECTION = "## Attention: dense vs blockwise (scripts/bench_attention.py)"
ROOT = Path(__file__).resolve().parents[1]


def ints(text):
    return [int(x) for x in text.split(",") if x]


class Case:
    """One compiled forward+backward program and its inputs."""

    def __init__(self, name, T, impl, args):
        norm = build(
            name, num_heads=args.heads, head_dim=args.head_dim, rngs=nnx.Rngs(0), impl=impl, block_size=args.block_size
        )
        # The backend this program runs (the normalizer chooses on its first trace, for its batch and heads).
        self.ran = norm.backend(T, T, Mask(causal=True), args.dtype, Workload(args.batch, args.heads)).name
        graphdef, state = nnx.split(norm)

        def loss(q, k, v, ct, state):
            out, _ = nnx.merge(graphdef, state)(q, k, v, Mask(causal=True))
            return jnp.sum(out.astype(jnp.float32) * ct)

        keys = jax.random.split(jax.random.key(0), 4)
        shape = (args.batch, args.heads, T, args.head_dim)  # the heads-major normalizer contract
        self.inputs = [jax.random.normal(kk, shape, args.dtype) for kk in keys[:3]]
        self.inputs += [jax.random.normal(keys[3], shape), state]
        self.compiled = jax.jit(jax.grad(loss, (0, 1, 2, 4))).lower(*self.inputs).compile()
        self.mem = peak_bytes(self.compiled)
        self.wall, self.cpu = [], []

    def sample(self):
        start = clock()
        jax.block_until_ready(self.compiled(*self.inputs))
        wall, cpu = since(start)
        self.wall.append(wall)
        self.cpu.append(cpu)
        return wall

    def release(self):
        del self.inputs, self.compiled


def measure(cases, budget):
    """One warm-up round, then interleaved rounds until the budget is spent; a first round over
    2 s is kept as the only sample (XLA:CPU has no warm-up effect worth a second such call)."""
    per_round = sum(c.sample() for c in cases)
    if per_round > 2.0:
        return
    for c in cases:
        c.wall, c.cpu = [], []
    interleave(
        {i: c.sample for i, c in enumerate(cases)}, max(1, min(15, int(budget / max(per_round, 1e-9)))), warmup=False
    )


def run(args):
    rows = []
    for T in args.T:
        for name in args.normalizers:
            timed = T <= args.time_all_max_T or (name in args.timed_at_length and T <= args.time_max_T)
            dense = Case(name, T, "dense", args) if T <= args.dense_max_T else None
            block = Case(name, T, "blockwise", args)
            cases = [c for c in (dense, block) if c is not None]
            if timed:
                measure(cases, args.budget)
            rows.append((T, name, dense, block))
            print(
                f"T={T} {name} (ran: {', '.join(c.ran for c in cases)}): "
                f"dense {seconds(dense and med(dense.wall))} {mib(dense and dense.mem)} MiB, "
                f"blockwise {seconds(med(block.wall))} {mib(block.mem)} MiB (n={len(block.wall)}); "
                f"load {load_average()}",
                file=sys.stderr,
                flush=True,
            )
            for c in cases:
                c.release()
    return rows


def report(args, rows, load_start, minutes):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    L = [
        SECTION,
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        f"- Date: {now}; `nproc` = {os.cpu_count()}; jax {jax.__version__}, backend {jax.default_backend()}; "
        f"load average (1/5/15 min) {load_start} at start, {load_average()} at end; took {minutes:.1f} min",
        f"- Command: `JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_attention.py {' '.join(sys.argv[1:])}`",
        f"- B={args.batch}, N={args.heads}, H={args.head_dim}, {args.dtype}, causal, block_size={args.block_size}",
        "",
    ]
    cells = []
    for T, name, d, b in rows:
        dw, dc = (med(d.wall), med(d.cpu)) if d else (None, None)
        cells.append(
            [
                T,
                name,
                seconds(dw),
                seconds(dc),
                mib(d and d.mem),
                seconds(med(b.wall)),
                seconds(med(b.cpu)),
                mib(b.mem),
                ratio(med(b.wall), dw),
                ratio(med(b.cpu), dc),
                ratio(b.mem, d and d.mem),
                len(b.wall),
            ]
        )
    L += table(
        [
            "T",
            "normalizer",
            "dense wall",
            "dense CPU",
            "dense MiB",
            "blockwise wall",
            "blockwise CPU",
            "blockwise MiB",
            "wall b/d",
            "CPU b/d",
            "mem b/d",
            "n",
        ],
        cells,
        "---:|---" + "|---:" * 10,
    )
    L += ["", goals(rows, args), ""]
    return "\n".join(L)


def goals(rows, args):
    """Plain statements on the goals at T=8192 and on the growth of blockwise memory."""
    at = [(n, d, b) for T, n, d, b in rows if T == 8192]
    out = []
    if at:
        worst = max(at, key=lambda r: r[2].mem)
        out.append(
            f"At T=8192 the largest blockwise peak is {mib(worst[2].mem)} MiB ({worst[0]}): goal ≤ 512 MiB "
            f"{'met' if worst[2].mem <= 512 * MiB else 'NOT met'}."
        )
        timed = [(n, med(b.cpu) / med(d.cpu), med(b.wall) / med(d.wall)) for n, d, b in at if d and d.cpu and b.cpu]
        if timed:
            out.append(
                "Time blockwise/dense at T=8192 (CPU, wall): "
                + ", ".join(f"{n} {c:.2f}×, {w:.2f}×" for n, c, w in timed)
                + f"; goal ≤ 1.2× "
                f"{'met' if all(min(c, w) <= 1.2 for _, c, w in timed) else 'NOT met'} for every normalizer."
            )
    for name in args.normalizers:
        mem = [(T, b.mem) for T, n, _, b in rows if n == name]
        if len(mem) >= 2:
            (t0, m0), (t1, m1) = mem[0], mem[-1]
            out.append(f"{name} blockwise memory T={t0}→{t1}: ×{m1 / m0:.1f} for ×{t1 // t0} in T.")
    return " ".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=ints, default=[256, 1024, 4096, 8192, 16384, 32768])
    p.add_argument(
        "--normalizers",
        type=lambda s: s.split(","),
        default=["softmax", "kl", "softmax1", "sigmoid", "relu", "squared"],
    )
    p.add_argument("--dense-max-T", type=int, default=8192)
    p.add_argument("--time-all-max-T", type=int, default=8192)
    p.add_argument("--timed-at-length", type=lambda s: s.split(","), default=["softmax"])
    p.add_argument("--time-max-T", type=int, default=16384, help="above this T, memory only")
    p.add_argument("--block-size", type=int, default=512)
    p.add_argument("--budget", type=float, default=6.0, help="seconds of timed samples per dense/blockwise pair")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md")
    args = p.parse_args(argv)
    load_start, t0 = load_average(), time.perf_counter()
    rows = run(args)
    text = report(args, rows, load_start, (time.perf_counter() - t0) / 60)
    print(text)
    if args.write:
        write_section(text, ROOT / "BENCHMARKS.md", ("## Attention scaling (scripts/bench_attention.py)", SECTION))


if __name__ == "__main__":
    main()
