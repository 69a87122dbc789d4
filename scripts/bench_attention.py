#!/usr/bin/env python
"""Causal softmax vs causal linear (elu1) attention: forward+backward time and peak memory vs T.

For each sequence length T the script compiles, for both normalizers,

    grad_{q,k,v} sum(attention(q, k, v, Mask(causal=True)) * cotangent)

(jax.jit of jax.grad, float32 by default) and reports

- time: the median of the timed samples after --warmup calls (each sample is timed with
  jax.block_until_ready; very fast programs are looped so that one sample lasts >= --min-sample
  seconds, and the per-call time is reported). Each case is timed alone, back to back, with
  as many samples as fit in --case-budget seconds, at least 3 and at most --repeats (a slow
  case also gets a single warm-up), so the whole run stays within a few minutes on 2 cores;
- peak memory: from XLA's buffer assignment of the compiled program,
  `compiled.memory_analysis()`: temp + arguments + outputs − aliased, deterministic (not a
  process RSS reading). If the backend gives no analysis the column says n/a;
- the ratio softmax/linear for both, and the growth per 4× T: (x(T)/x(T′))^(ln 4 / ln(T/T′)) for
  consecutive T′ < T in the list (≈ 4 for O(T), ≈ 16 for O(T²)).

Linear attention alone is also run at --linear-only-T (beyond the largest T, where softmax's
T×T buffers would not fit), to see its growth further out. Then, at the largest T, linear attention with each --chunk-sizes value (the chunked O(T) form's
chunk length; the YAML default is 64).

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


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


def make_program(name: str, num_heads: int, head_dim: int, **options):
    """A jitted grad_{q,k,v} sum(out * ct) of the named causal normalizer (params passed as an argument)."""
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
    """One compiled program and its inputs, timed in samples."""

    def __init__(self, label, name, T, args, **options):
        B, N, H = args.batch, args.heads, args.head_dim
        dtype = jnp.dtype(args.dtype)
        keys = jax.random.split(jax.random.key(args.seed), 4)
        q, k, v = (jax.random.normal(kk, (B, T, N, H), dtype) for kk in keys[:3])
        ct = jax.random.normal(keys[3], (B, T, N, H), jnp.float32)
        fn, state = make_program(name, N, H, **options)
        self.label, self.T = label, T
        self.inputs = (q, k, v, ct, state)
        t0 = time.perf_counter()
        self.compiled = fn.lower(*self.inputs).compile()
        self.compile_s = time.perf_counter() - t0
        self.mem = memory_bytes(self.compiled)
        self.samples: list[float] = []
        self.inner = 1

    def call(self):
        return jax.block_until_ready(self.compiled(*self.inputs))

    def warm(self, args) -> int:
        """Warm-up calls; returns the number of timed samples that fit in the case budget."""
        for _ in range(max(args.warmup, 1)):
            t0 = time.perf_counter()
            self.call()
            dt = time.perf_counter() - t0
            if dt * args.repeats > args.case_budget:
                break  # a slow case: one warm-up is enough
        self.inner = max(1, math.ceil(args.min_sample / max(dt, 1e-6)))
        return min(args.repeats, max(3, int(args.case_budget / max(dt * self.inner, 1e-6))))

    def release(self):
        del self.inputs, self.compiled  # free the buffers before the next case
        gc.collect()

    def measure(self, args):
        """Warm up, then take the samples back to back (each case alone: a big softmax's freeing of
        its T×T buffers must not land in a linear sample). Slow cases get fewer calls, >= 3 samples."""
        for _ in range(self.warm(args)):
            self.sample()
        self.release()

    def sample(self):
        t0 = time.perf_counter()
        for _ in range(self.inner):
            self.call()
        self.samples.append((time.perf_counter() - t0) / self.inner)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(max − min) / median of the samples: a noise indicator."""
        return (max(self.samples) - min(self.samples)) / self.median


def fmt_time(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 10 else f"{s:,.2f} s"


def fmt_mem(b: int | None) -> str:
    return "n/a" if b is None else f"{b / MiB:,.1f} MiB"


def fmt_ratio(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:,.1f}×"


def growth(prev, cur, key):
    """Growth of key(case) per 4× T between two cases (normalised if the T step is not 4×)."""
    if prev is None:
        return None
    a, b = key(prev), key(cur)
    if a is None or b is None or a <= 0:
        return None
    return (b / a) ** (math.log(4) / math.log(cur.T / prev.T))


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


def command_line() -> str:
    env = f"JAX_PLATFORMS={os.environ['JAX_PLATFORMS']} " if "JAX_PLATFORMS" in os.environ else ""
    script = os.path.relpath(Path(sys.argv[0]).resolve(), ROOT)
    return f"{env}.venv/bin/python {shlex.join([script, *sys.argv[1:]])}"


def report(args, main_rows, chunk_cases) -> str:
    jax_ver = jax.__version__
    try:
        import jaxlib

        jax_ver += f" (jaxlib {jaxlib.__version__})"
    except Exception:  # noqa: BLE001
        pass
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    L = [SECTION, ""]
    L.append(
        f"Causal softmax vs causal linear (elu1, chunked O(T) form, chunk_size={args.chunk_size}) attention, "
        f"forward+backward: `jax.jit(jax.grad(sum(out · ct)))` w.r.t. q, k, v. "
        f"B={args.batch}, N={args.heads} heads, H={args.head_dim}, {args.dtype}. "
        f"Time: median of the samples (n per case below: as many as fit in {args.case_budget:g} s, 3 to "
        f"{args.repeats}) after {args.warmup} warm-up call(s), each case timed alone; compile time excluded. Peak memory: XLA's `compiled.memory_analysis()` "
        f"(temp + arguments + outputs − aliased), deterministic."
    )
    L.append("")
    L.append(f"- Date: {now}")
    L.append(f"- Machine: {machine_line()}")
    L.append(f"- Python {platform.python_version()}, jax {jax_ver}")
    L.append(f"- Command: `{command_line()}`")
    L.append("")
    L.append("| T | softmax time | linear time | time ratio (s/l) | softmax peak mem | linear peak mem "
             "| mem ratio (s/l) | softmax time ×/4T | linear time ×/4T | softmax mem ×/4T | linear mem ×/4T |")
    L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    prev = (None, None)
    for sm, li in main_rows:
        t_ratio = sm.median / li.median if sm else None
        m_ratio = sm.mem / li.mem if sm and sm.mem and li.mem else None
        g_sm_t = growth(prev[0], sm, lambda c: c.median) if sm else None
        g_sm_m = growth(prev[0], sm, lambda c: c.mem) if sm else None
        L.append(
            f"| {li.T} | {fmt_time(sm.median) if sm else 'not run'} | {fmt_time(li.median)} | {fmt_ratio(t_ratio)} "
            f"| {fmt_mem(sm.mem) if sm else 'not run'} | {fmt_mem(li.mem)} | {fmt_ratio(m_ratio)} "
            f"| {fmt_ratio(g_sm_t)} | {fmt_ratio(growth(prev[1], li, lambda c: c.median))} "
            f"| {fmt_ratio(g_sm_m)} | {fmt_ratio(growth(prev[1], li, lambda c: c.mem))} |"
        )
        prev = (sm, li)
    L.append("")
    L.append("×/4T: growth per 4× T between consecutive rows, (x(T)/x(T′))^(ln 4 / ln(T/T′)) — about 4× "
             "for O(T), 16× for O(T²). 'not run': linear alone (--linear-only-T), softmax's T×T buffers "
             "would not fit. Samples n and spread ((max−min)/median, a noise indicator): "
             + "; ".join(f"T={li.T}: " + (f"softmax n={len(sm.samples)} {sm.spread:.0%}, " if sm else "")
                         + f"linear n={len(li.samples)} {li.spread:.0%}" for sm, li in main_rows)
             + ".")
    if chunk_cases:
        T = chunk_cases[0].T
        L.append("")
        L.append(f"Linear attention chunk size at T={T} (same program and timing protocol, except that the "
                 f"chunk sizes' samples are interleaved; n={len(chunk_cases[0].samples)} each):")
        L.append("")
        L.append("| chunk_size | fwd+bwd time (median) | fastest sample | peak mem | median vs chunk_size=64 |")
        L.append("|---:|---:|---:|---:|---:|")
        base = next((c for c in chunk_cases if c.chunk == 64), chunk_cases[0])
        for c in chunk_cases:
            L.append(f"| {c.chunk}{' (default)' if c.chunk == 64 else ''} | {fmt_time(c.median)} "
                     f"| {fmt_time(min(c.samples))} | {fmt_mem(c.mem)} | {c.median / base.median:.2f}× |")
    L.append("")
    L.extend(verdict(args, main_rows, chunk_cases))
    L.append("")
    return "\n".join(L)


def verdict(args, main_rows, chunk_cases) -> list[str]:
    """Plain statements on the two expectations: linear ~O(T) in time and memory; ≥10× faster at T=max."""
    both = [(sm, li) for sm, li in main_rows if sm]
    lins = [li for _, li in main_rows]
    lines = []
    if len(lins) >= 2:
        steps = [(a.T, b.T, growth(a, b, lambda c: c.median), growth(a, b, lambda c: c.mem))
                 for a, b in zip(lins, lins[1:])]
        full_t = growth(lins[0], lins[-1], lambda c: c.median)
        full_m = growth(lins[0], lins[-1], lambda c: c.mem)
        # Judge time on the steps with T >= 4096 (the small-T ones mix fixed overheads and cache fits).
        big = [st for st in steps if st[0] >= 4096] or steps[-1:]
        time_ok = all(st[2] is not None and st[2] <= 6 for st in big)
        mem_ok = all(st[3] is not None and st[3] <= 6 for st in steps)
        fast = [f"{a}→{b} ({fmt_ratio(g)})" for a, b, g, _ in steps if g is not None and g > 6]
        lines.append(
            f"Linear attention, T={lins[0].T}→{lins[-1].T}: per 4× T, time ×{full_t:.1f} and peak memory "
            f"×{full_m:.1f} overall; memory is {'about linear at every step' if mem_ok else 'NOT linear at every step'}; "
            f"time grows ≤ 6× per 4× T on the large-T step(s) {', '.join(f'{a}→{b}' for a, b, _, _ in big)}: "
            f"{'yes' if time_ok else 'NO'}"
            + (f" (steps above 6× per 4× T: {', '.join(fast)})" if fast else "")
            + f". Expectation 'linear time and memory grow about linearly in T': "
            f"{'met' if time_ok and mem_ok else 'NOT met'}."
        )
    if both:
        sm, li = both[-1]
        ratio = sm.median / li.median
        mem = fmt_ratio(sm.mem / li.mem if sm.mem and li.mem else None)
        lines.append(
            f"At T={sm.T} linear is {ratio:,.1f}× faster than softmax (fwd+bwd) and needs {mem} less peak "
            f"memory: expectation '≥ 10× faster at T={sm.T}' {'met' if ratio >= 10 else 'NOT met'}."
        )
    if chunk_cases:
        best = min(chunk_cases, key=lambda c: c.median)
        base = next((c for c in chunk_cases if c.chunk == 64), None)
        lines.append(f"Fastest chunk size at T={best.T}: {best.chunk}"
                     + (f" ({best.median / base.median:.2f}× the time of the default 64)."
                        if base and base is not best else "."))
    return [" ".join(lines)]


def write_section(text: str, path: Path):
    """Replace the section from SECTION to the next '## ' heading (or EOF); create the file if needed."""
    body = text.rstrip("\n") + "\n"
    if not path.exists():
        path.write_text("# Benchmarks\n\n" + body)
        return
    lines = path.read_text().splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.rstrip("\n") == SECTION), None)
    if start is None:
        old = "".join(lines).rstrip("\n")
        path.write_text(old + "\n\n" + body)
        return
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"## ", lines[i])), len(lines))
    tail = lines[end:]
    path.write_text("".join(lines[:start]) + body + ("\n" + "".join(tail) if tail else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=parse_ints, default=[256, 1024, 4096, 8192], help="sequence lengths, comma-separated")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="dtype of q, k, v")
    p.add_argument("--chunk-size", type=int, default=64, help="linear chunk size in the main table")
    p.add_argument("--chunk-sizes", type=parse_ints, default=[32, 64, 128],
                   help="chunk sizes timed for linear at the largest T (empty string to skip)")
    p.add_argument("--repeats", type=int, default=15, help="most timed samples per case (median reported)")
    p.add_argument("--linear-only-T", type=parse_ints, default=[16384, 32768],
                   help="extra sequence lengths for linear alone (empty string to skip)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls after compiling")
    p.add_argument("--case-budget", type=float, default=45.0,
                   help="seconds of timed calls per case; slower cases get fewer samples (at least 3)")
    p.add_argument("--min-sample", type=float, default=0.05, help="loop fast programs to last this long per sample (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write", action="store_true", help=f"update '{SECTION}' in BENCHMARKS.md")
    p.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md", help="file updated by --write")
    args = p.parse_args(argv)
    args.T = sorted(args.T)

    main_rows = []
    for T in args.T:
        sm = Case("softmax", "softmax", T, args)
        sm.measure(args)
        li = Case("linear", "linear", T, args, feature_map="elu1", chunk_size=args.chunk_size)
        li.measure(args)
        main_rows.append((sm, li))
        print(f"T={T}: softmax {fmt_time(sm.median)} {fmt_mem(sm.mem)} (compile {sm.compile_s:.1f}s), "
              f"linear {fmt_time(li.median)} {fmt_mem(li.mem)} (compile {li.compile_s:.1f}s), "
              f"ratio {sm.median / li.median:.1f}×", file=sys.stderr, flush=True)

    for T in sorted(t for t in args.linear_only_T if t > args.T[-1]):
        li = Case("linear", "linear", T, args, feature_map="elu1", chunk_size=args.chunk_size)
        li.measure(args)
        main_rows.append((None, li))
        print(f"T={T}: linear {fmt_time(li.median)} {fmt_mem(li.mem)}", file=sys.stderr, flush=True)

    chunk_cases = []
    if args.chunk_sizes:
        T = args.T[-1]
        for C in args.chunk_sizes:
            c = Case(f"linear C={C}", "linear", T, args, feature_map="elu1", chunk_size=C)
            c.chunk = C
            chunk_cases.append(c)
        # Same-sized programs: interleave their samples so that load changes hit all chunk sizes alike.
        n = min(c.warm(args) for c in chunk_cases)
        for _ in range(n):
            for c in chunk_cases:
                c.sample()
        for c in chunk_cases:
            c.release()
        print("chunks at T=%d: " % T + ", ".join(f"{c.chunk}: {fmt_time(c.median)}" for c in chunk_cases),
              file=sys.stderr, flush=True)

    text = report(args, main_rows, chunk_cases)
    print(text)
    if args.write:
        write_section(text, args.output)
        print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
