"""Timing, memory and Markdown helpers shared by scripts/bench_train.py and scripts/bench_attention.py.

The protocol they implement (interleaved variants, medians of wall and process CPU time, XLA's
compiled memory analysis) is written out in BENCHMARKS.md.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from pathlib import Path
from typing import Any, Callable

MiB = 2**20


# --- timing -----------------------------------------------------------------------------------


def clock() -> tuple[float, float]:
    """(wall, process CPU) now; process CPU counts every thread, so XLA's intra-op pool is included."""
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> tuple[float, float]:
    """(wall s, CPU s) elapsed since a `clock()` reading."""
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]


def interleave(samplers: dict[str, Callable[[], Any]], rounds: int, warmup: bool = True) -> dict[str, list]:
    """Each variant's samples from `rounds` rounds, the variants back to back in every round.

    The order rotates and alternates direction from round to round, so a load change or a position
    effect hits every variant alike; with `warmup` a first round is run and discarded.
    """
    names = list(samplers)
    out = {n: [] for n in names}
    for r in range(rounds + 1 if warmup else rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order[::-1] if r % 2 else order:
            result = samplers[name]()
            if r or not warmup:
                out[name].append(result)
    return out


def med(xs):
    """The median; None for no samples."""
    return statistics.median(xs) if xs else None


# --- memory -----------------------------------------------------------------------------------


def peak_bytes(compiled) -> int | None:
    """XLA's peak of a compiled program: temp + arguments + outputs − aliased (deterministic)."""
    ma = compiled.memory_analysis()
    if ma is None:
        return None
    return ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes


# --- report -----------------------------------------------------------------------------------


def load_average() -> str:
    """The 1/5/15-minute load averages, as 'a/b/c'."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def seconds(s: float | None) -> str:
    return "–" if s is None else (f"{s * 1e3:,.1f} ms" if s < 10 else f"{s:,.1f} s")


def mib(b: int | None) -> str:
    return "–" if b is None else f"{b / MiB:,.1f}"


def ratio(a, b) -> str:
    return "–" if a is None or not b else f"{a / b:.2f}×"


def paired_ratio(a: list[float], b: list[float]) -> str:
    """Median (min–max) of the per-round ratios a_i / b_i: the two ran back to back in each round."""
    rs = [x / y for x, y in zip(a, b)]
    return f"{med(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})"


def table(header: list[str], rows: list[list], align: str | None = None) -> list[str]:
    """A Markdown table's lines; `align` is one '---' / '---:' cell per column (default left)."""
    aligns = align.split("|") if align else ["---"] * len(header)
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(aligns) + "|",
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


def write_section(text: str, path: Path, headings: tuple[str, ...]) -> None:
    """Replace the section whose heading is one of `headings` (up to the next '## ') by `text`."""
    lines = path.read_text().splitlines(keepends=True) if path.exists() else ["# Benchmarks\n", "\n"]
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") in headings), None)
    if start is None:
        lines, start = lines + ["\n"], len(lines) + 1
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"## ", lines[i])), len(lines))
    tail = lines[end:]
    path.write_text("".join(lines[:start]) + text.rstrip("\n") + "\n" + ("\n" + "".join(tail) if tail else ""))
