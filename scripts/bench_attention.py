#!/usr/bin/env python
"""Causal softmax vs causal linear (elu1) attention: forward+backward time and peak memory vs T.

For each sequence length T the script compiles, for both normalizers,

    grad_{q,k,v} sum(attention(q, k, v, Mask(causal=True)) * cotangent)

(jax.jit of jax.grad, float32 by default; linear uses its chunked O(T) causal form) and reports

- wall time: the median of the timed samples after --warmup calls (each sample is timed with
  jax.block_until_ready; very fast programs are looped so that one sample lasts >= --min-sample
  seconds, and the per-call time is reported). Each case is timed alone, back to back, with as
  many samples as fit in --case-budget seconds, at least 3 and at most --repeats (a slow case
  also gets a single warm-up), so the whole run stays within a few minutes on 2 cores;
- CPU time: the median per-call process CPU time (user + system, all threads) of the same
  samples. On a shared, oversubscribed machine wall time includes waiting for a core; CPU time
  measures the work done and is far steadier, so the growth factors are given for both;
- peak memory: from XLA's buffer assignment of the compiled program,
  `compiled.memory_analysis()`: temp + arguments + outputs − aliased, deterministic (not a
  process RSS reading). If the backend gives no analysis the column says n/a;
- the ratios softmax/linear, and the growth per 4× T: (x(T)/x(T′))^(ln 4 / ln(T/T′)) for
  consecutive T′ < T (≈ 4 for O(T), ≈ 16 for O(T²)).

Linear attention alone is also run at --linear-only-T (beyond the largest T, where softmax's T×T
buffers would not fit) to follow its growth further. Then, at the largest T, linear attention
with each of --chunk-sizes (the chunked form's chunk length; the YAML default is 64), samples
interleaved.

Prints a Markdown report; with --write it replaces the "## Attention scaling" section of
BENCHMARKS.md (creating the file if needed) and leaves every other section as it is.

    JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_attention.py            # print only
    JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_attention.py --write    # and update BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import datetime
import gc
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.normalizers import Mask, build

SECTION = "## Attention scaling (scripts/bench_attention.py)"
ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20
DEFAULT_CHUNK = 64  # configs/normalizer/linear.yaml


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


def make_program(name: str, num_heads: int, head_dim: int, **options):
    """jax.jit(grad_{q,k,v} sum(out * ct)) of the named causal normalizer; its state is an argument."""
    norm = build(name, num_heads=num_heads, head_dim=head_dim, rngs=nnx.Rngs(0), **options)
    graphdef, state = nnx.split(norm)

    def loss(q, k, v, ct, state):
        out, _ = nnx.merge(graphdef, state)(q, k, v, Mask(causal=True), with_stats=False)
        return jnp.sum(out.astype(jnp.float32) * ct)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))), state


def memory_bytes(compiled) -> int | None:
    """Peak-memory estimate of a compiled program from XLA's buffer assignment, or None."""
    try:
        ma = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - backends without the analysis raise various errors
        return None
    if ma is None:
        return None
    return int(ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes
               - getattr(ma, "alias_size_in_bytes", 0))


class Case:
    """One compiled program and its inputs, timed in samples (wall and process CPU time per call)."""

    def __init__(self, name, T, args, **options):
        B, N, H = args.batch, args.heads, args.head_dim
        dtype = jnp.dtype(args.dtype)
        keys = jax.random.split(jax.random.key(args.seed), 4)
        q, k, v = (jax.random.normal(kk, (B, T, N, H), dtype) for kk in keys[:3])
        ct = jax.random.normal(keys[3], (B, T, N, H), jnp.float32)
        fn, state = make_program(name, N, H, **options)
        self.name, self.T, self.chunk = name, T, options.get("chunk_size")
        self.inputs = (q, k, v, ct, state)
        t0 = time.perf_counter()
        self.compiled = fn.lower(*self.inputs).compile()
        self.compile_s = time.perf_counter() - t0
        self.mem = memory_bytes(self.compiled)
        self.samples: list[float] = []
        self.cpu_samples: list[float] = []
        self.inner = 1

    def call(self):
        return jax.block_until_ready(self.compiled(*self.inputs))

    def warm(self, args) -> int:
        """Warm-up calls; returns how many timed samples fit in the case budget."""
        for _ in range(max(args.warmup, 1)):
            t0 = time.perf_counter()
            self.call()
            dt = time.perf_counter() - t0
            if dt * args.repeats > args.case_budget:
                break  # a slow case: one warm-up is enough
        self.inner = max(1, math.ceil(args.min_sample / max(dt, 1e-6)))
        return min(args.repeats, max(3, int(args.case_budget / max(dt * self.inner, 1e-6))))

    def sample(self):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(self.inner):
            self.call()
        self.samples.append((time.perf_counter() - t0) / self.inner)
        self.cpu_samples.append((time.process_time() - c0) / self.inner)

    def release(self):
        del self.inputs, self.compiled  # free the buffers before the next case
        gc.collect()

    def measure(self, args):
        """Warm up, then take the samples back to back: each case alone, so that a big softmax
        freeing its T×T buffers does not land in a linear sample."""
        for _ in range(self.warm(args)):
            self.sample()
        self.release()

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpu_samples)

    @property
    def spread(self) -> float:
        """(max − min) / median of the wall-time samples: a noise indicator."""
        return (max(self.samples) - min(self.samples)) / self.median


def fmt_time(s: float | None) -> str:
    if s is None:
        return "not run"
    return f"{s * 1e3:,.1f} ms" if s < 10 else f"{s:,.2f} s"


def fmt_mem(b: int | None) -> str:
    return "n/a" if b is None else f"{b / MiB:,.1f} MiB"


def fmt_ratio(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:,.1f}×"


def growth(prev, cur, key):
    """Growth of key(case) per 4× T between two cases (normalised if the T step is not 4×)."""
    if prev is None or cur is None:
        return None
    a, b = key(prev), key(cur)
    if a is None or b is None or a <= 0:
        return None
    return (b / a) ** (math.log(4) / math.log(cur.T / prev.T))


def ratio(a, b):
    return a / b if a is not None and b else None


WALL, CPU, MEM = (lambda c: c.median), (lambda c: c.cpu), (lambda c: c.mem)


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
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        mem_txt = f", {mem:.0f} GiB RAM"
    except (ValueError, OSError, AttributeError):
        mem_txt = ""
    devs = ", ".join(sorted({d.platform for d in jax.devices()}))
    return f"{nproc}-core CPU (`nproc` = {nproc}; {cpu}){mem_txt}; JAX backend: {devs}"


def load_avg() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def command_line() -> str:
    env = f"JAX_PLATFORMS={os.environ['JAX_PLATFORMS']} " if "JAX_PLATFORMS" in os.environ else ""
    script = os.path.relpath(Path(sys.argv[0]).resolve(), ROOT)
    return f"{env}.venv/bin/python {shlex.join([script, *sys.argv[1:]])}"


def report(args, rows, chunk_cases, load_start, load_end) -> str:
    jax_ver = jax.__version__
    try:
        import jaxlib

        jax_ver += f" (jaxlib {jaxlib.__version__})"
    except Exception:  # noqa: BLE001
        pass
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    L = [SECTION, ""]
    L.append(
        f"Causal softmax vs causal linear attention (elu1 features, chunked O(T) form, "
        f"chunk_size={args.chunk_size}), forward+backward: `jax.jit(jax.grad(sum(out · ct)))` w.r.t. q, k, v, "
        f"ct a fixed random cotangent. B={args.batch}, N={args.heads} heads, H={args.head_dim}, {args.dtype} "
        f"inputs. Wall time: median of the samples (as many as fit in {args.case_budget:g} s, 3 to "
        f"{args.repeats}; n below) after warm-up, each case timed alone, compile time excluded. CPU time: "
        f"median process CPU time (user + system, all threads) per call of the same samples — the steadier "
        f"measure on a shared machine, where wall time includes waiting for a core. Peak memory: XLA's "
        f"`compiled.memory_analysis()` (temp + arguments + outputs − aliased), deterministic."
    )
    L.append("")
    L.append(f"- Date: {now}")
    L.append(f"- Machine: {machine_line()}; load average (1/5/15 min) {load_start} at start, {load_end} at end")
    L.append(f"- Python {platform.python_version()}, jax {jax_ver}")
    L.append(f"- Command: `{command_line()}`")
    L.append("")
    L.append("| T | softmax wall | linear wall | wall ratio s/l | softmax CPU | linear CPU | CPU ratio s/l "
             "| softmax peak mem | linear peak mem | mem ratio s/l |")
    L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sm, li in rows:
        L.append(
            f"| {li.T} | {fmt_time(sm and sm.median)} | {fmt_time(li.median)} "
            f"| {fmt_ratio(ratio(sm and sm.median, li.median))} "
            f"| {fmt_time(sm and sm.cpu)} | {fmt_time(li.cpu)} | {fmt_ratio(ratio(sm and sm.cpu, li.cpu))} "
            f"| {fmt_mem(sm.mem) if sm else 'not run'} | {fmt_mem(li.mem)} "
            f"| {fmt_ratio(ratio(sm and sm.mem, li.mem))} |"
        )
    L.append("")
    L.append("Growth per 4× T from the previous row, (x(T)/x(T′))^(ln 4 / ln(T/T′)): about 4× for O(T), "
             "16× for O(T²).")
    L.append("")
    L.append("| T′ → T | softmax wall | linear wall | softmax CPU | linear CPU | softmax mem | linear mem |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for (psm, pli), (sm, li) in zip(rows, rows[1:]):
        L.append(f"| {pli.T} → {li.T} | " + " | ".join(
            fmt_ratio(growth(a, b, key)) for key in (WALL, CPU, MEM) for a, b in ((psm, sm), (pli, li))) + " |")
    L.append("")
    L.append("'not run': linear alone (--linear-only-T); softmax's T×T buffers would not fit. Samples n and "
             "wall-time spread ((max−min)/median, a noise indicator): "
             + "; ".join(f"T={li.T}: " + (f"softmax n={len(sm.samples)} {sm.spread:.0%}, " if sm else "")
                         + f"linear n={len(li.samples)} {li.spread:.0%}" for sm, li in rows) + ".")
    if chunk_cases:
        T = chunk_cases[0].T
        base = next((c for c in chunk_cases if c.chunk == DEFAULT_CHUNK), chunk_cases[0])
        L.append("")
        L.append(f"Linear attention chunk size at T={T} (same program; the chunk sizes' samples interleaved, "
                 f"n={len(chunk_cases[0].samples)} each):")
        L.append("")
        L.append(f"| chunk_size | wall (median) | wall (fastest) | CPU (median) | peak mem "
                 f"| wall vs {base.chunk} | CPU vs {base.chunk} |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|")
        for c in chunk_cases:
            L.append(f"| {c.chunk}{' (default)' if c.chunk == DEFAULT_CHUNK else ''} | {fmt_time(c.median)} "
                     f"| {fmt_time(min(c.samples))} | {fmt_time(c.cpu)} | {fmt_mem(c.mem)} "
                     f"| {c.median / base.median:.2f}× | {c.cpu / base.cpu:.2f}× |")
    L.append("")
    L.append(verdict(rows, chunk_cases))
    L.append("")
    return "\n".join(L)


def verdict(rows, chunk_cases) -> str:
    """Plain statements on the expectations: linear ~O(T) in time and memory; ≥10× faster at the largest T."""
    lins = [li for _, li in rows]
    out = []
    if len(lins) >= 2:
        steps = list(zip(lins, lins[1:]))
        # Judge time on the steps from T >= 4096 (smaller T mixes fixed per-call costs and cache fits).
        big = [(a, b) for a, b in steps if a.T >= 4096] or steps[-1:]
        names = ", ".join(f"{a.T}→{b.T}" for a, b in big)
        big_cpu = [growth(a, b, CPU) for a, b in big]
        big_wall = [growth(a, b, WALL) for a, b in big]
        mem_g = [growth(a, b, MEM) for a, b in steps]
        mem_ok = all(g is not None and g <= 6 for g in mem_g)
        cpu_ok = all(g <= 6 for g in big_cpu)
        wall_ok = all(g <= 6 for g in big_wall)
        out.append(
            f"Linear attention, T={lins[0].T}→{lins[-1].T}, growth per 4× T over the whole range: "
            f"wall ×{growth(lins[0], lins[-1], WALL):.1f}, CPU ×{growth(lins[0], lins[-1], CPU):.1f}, "
            f"peak memory ×{growth(lins[0], lins[-1], MEM):.1f}. On the large-T steps ({names}): "
            f"CPU ×{', ×'.join(f'{g:.1f}' for g in big_cpu)}, wall ×{', ×'.join(f'{g:.1f}' for g in big_wall)}; "
            f"memory {'≤ 6× at every step' if mem_ok else 'above 6× at some step'}. "
            f"Expectation 'linear time and memory grow about linearly in T' (≤ 6× per 4× T at large T): "
            f"memory {'met' if mem_ok else 'NOT met'}; time {'met' if cpu_ok else 'NOT met'} by CPU time, "
            f"{'met' if wall_ok else 'NOT met'} by wall time."
        )
    both = [(sm, li) for sm, li in rows if sm]
    if both:
        sm, li = both[-1]
        r_wall, r_cpu = sm.median / li.median, sm.cpu / li.cpu
        out.append(
            f"At T={sm.T} linear is {r_wall:,.1f}× faster than softmax in wall time ({r_cpu:,.1f}× in CPU time) "
            f"and needs {fmt_ratio(ratio(sm.mem, li.mem))} less peak memory: expectation '≥ 10× faster at "
            f"T={sm.T}' {'met' if min(r_wall, r_cpu) >= 10 else 'NOT met'}."
        )
    if chunk_cases:
        best_wall = min(chunk_cases, key=WALL)
        best_cpu = min(chunk_cases, key=CPU)
        out.append(f"Fastest chunk size at T={best_wall.T}: {best_wall.chunk} by median wall time, "
                   f"{best_cpu.chunk} by CPU time.")
    return " ".join(out)


def write_section(text: str, path: Path):
    """Replace the section from SECTION to the next '## ' heading (or EOF); create the file if needed."""
    body = text.rstrip("\n") + "\n"
    if not path.exists():
        path.write_text("# Benchmarks\n\n" + body)
        return
    lines = path.read_text().splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == SECTION), None)
    if start is None:
        path.write_text("".join(lines).rstrip("\n") + "\n\n" + body)
        return
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"## ", lines[i])), len(lines))
    tail = lines[end:]
    path.write_text("".join(lines[:start]) + body + ("\n" + "".join(tail) if tail else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=parse_ints, default=[256, 1024, 4096, 8192],
                   help="sequence lengths for both, comma-separated (default 256,1024,4096,8192)")
    p.add_argument("--linear-only-T", type=parse_ints, default=[16384, 32768],
                   help="extra sequence lengths for linear alone (default 16384,32768; '' to skip)")
    p.add_argument("--batch", type=int, default=1, help="B (default 1)")
    p.add_argument("--heads", type=int, default=4, help="N (default 4)")
    p.add_argument("--head-dim", type=int, default=64, help="H (default 64)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="dtype of q, k, v")
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK, help="linear chunk size in the main table")
    p.add_argument("--chunk-sizes", type=parse_ints, default=[32, 64, 128],
                   help="chunk sizes timed for linear at the largest T (default 32,64,128; '' to skip)")
    p.add_argument("--repeats", type=int, default=15, help="most timed samples per case (default 15)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls after compiling (default 2)")
    p.add_argument("--case-budget", type=float, default=45.0,
                   help="seconds of timed calls per case; slower cases get fewer samples, at least 3 (default 45)")
    p.add_argument("--min-sample", type=float, default=0.05,
                   help="loop fast programs so one sample lasts this long, seconds (default 0.05)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write", action="store_true", help=f"replace '{SECTION}' in --output")
    p.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md", help="file updated by --write")
    args = p.parse_args(argv)
    args.T = sorted(args.T)
    load_start = load_avg()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    rows = []
    for T in args.T:
        sm = Case("softmax", T, args)
        sm.measure(args)
        li = Case("linear", T, args, feature_map="elu1", chunk_size=args.chunk_size)
        li.measure(args)
        rows.append((sm, li))
        log(f"T={T}: softmax {fmt_time(sm.median)} (CPU {fmt_time(sm.cpu)}) {fmt_mem(sm.mem)}, "
            f"linear {fmt_time(li.median)} (CPU {fmt_time(li.cpu)}) {fmt_mem(li.mem)}, "
            f"ratio {sm.median / li.median:.1f}× (CPU {sm.cpu / li.cpu:.1f}×); load {load_avg()}")

    for T in sorted(t for t in args.linear_only_T if t > args.T[-1]):
        li = Case("linear", T, args, feature_map="elu1", chunk_size=args.chunk_size)
        li.measure(args)
        rows.append((None, li))
        log(f"T={T}: linear {fmt_time(li.median)} (CPU {fmt_time(li.cpu)}) {fmt_mem(li.mem)}")

    chunk_cases = []
    if args.chunk_sizes:
        T = args.T[-1]
        chunk_cases = [Case("linear", T, args, feature_map="elu1", chunk_size=C) for C in args.chunk_sizes]
        # Same-sized programs: interleave their samples so that load changes hit all chunk sizes alike.
        n = min(c.warm(args) for c in chunk_cases)
        for _ in range(n):
            for c in chunk_cases:
                c.sample()
        for c in chunk_cases:
            c.release()
        log(f"chunks at T={T}: " + ", ".join(f"{c.chunk}: {fmt_time(c.median)} (CPU {fmt_time(c.cpu)})"
                                             for c in chunk_cases))

    text = report(args, rows, chunk_cases, load_start, load_avg())
    print(text)
    if args.write:
        write_section(text, args.output)
        log(f"wrote {args.output}")


if __name__ == "__main__":
    main()
