"""The default experiment's compile at a base commit and now, per program: four-step runs, sides alternating.

Each round runs `python -m attnlab trainer.steps=4 trainer.eval_every=4 trainer.log_every=2 compile_cache=null`
once per side (the base commit's src/ and this tree's, bench_train.source_tree), with JAX's compile log on; a first
round warms the disk cache and is discarded. Printed: per run the run's compile_time_s, the plain and the logging
step's XLA compile (the first and second `jit(single)` JAX logs), the final metrics' seconds; then each figure's
median per side and the per-round ratio now / base, median (min-max).

    JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_compile.py --base ff260d5 --rounds 5

With --screen, each round is a 3-rate screen per side instead: three four-step runs at optim.lr 1e-3, 3e-3, 1e-2
sharing one new persistent compilation cache (as a sweep's jobs share compile_cache); printed per side, the median
compile_time_s of each rate's run and of the later rates' over the first's. With --screen --sweep, the three rates are
one Hydra sweep (`-m optim.lr=1e-3,3e-3,1e-2`, the basic launcher: one process), as a study's screen runs them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from bench_train import source_tree

FIGURES = ("compile_time_s", "plain step", "logging step", "final metrics")


SCREEN_RATES = ("1e-3", "3e-3", "1e-2")


def four_step_run(src: str, run_dir: str, *extra: str) -> tuple[float, float, float, float]:
    """(compile_time_s, the plain step's compile, the logging step's compile, final metrics seconds) of one run
    (0.0 for a step loaded from the persistent cache)."""
    env = {**os.environ, "PYTHONPATH": src, "JAX_PLATFORMS": "cpu", "JAX_LOG_COMPILES": "1"}
    args = ["trainer.steps=4", "trainer.eval_every=4", "trainer.log_every=2", "trainer.progress=none"]
    extra = extra or ("compile_cache=null",)
    proc = subprocess.run(
        [sys.executable, "-m", "attnlab", *args, *extra, f"hydra.run.dir={run_dir}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    steps = [
        float(x) for x in re.findall(r"XLA compilation of jit\(single\) in ([0-9.]+) s", proc.stdout + proc.stderr)
    ]
    steps += [0.0] * (2 - len(steps))
    m = json.loads(open(os.path.join(run_dir, "metrics.json")).read())
    return m["compile_time_s"], steps[0], steps[1], m["timing"]["final_metrics"]


def one_sweep(src: str, sweep_dir: str, cache: str) -> list[float]:
    """compile_time_s of each job of one four-step sweep over SCREEN_RATES (one process), in rate order."""
    env = {**os.environ, "PYTHONPATH": src, "JAX_PLATFORMS": "cpu"}
    args = ["trainer.steps=4", "trainer.eval_every=4", "trainer.log_every=2", "trainer.progress=none"]
    rates = f"optim.lr={','.join(SCREEN_RATES)}"
    command = [
        sys.executable,
        "-m",
        "attnlab",
        "-m",
        rates,
        *args,
        f"compile_cache={cache}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    jobs = sorted(os.listdir(sweep_dir), key=lambda name: int(name.split("_")[0]) if name[0].isdigit() else -1)
    return [json.load(open(f"{sweep_dir}/{job}/metrics.json"))["compile_time_s"] for job in jobs if job[0].isdigit()]


def screen(trees: dict[str, str], rounds: int, tmp: str, sweep: bool) -> None:
    """Per round and side, the compile_time_s of three runs at SCREEN_RATES sharing a new compile cache: three
    processes, or one sweep's (`sweep`)."""
    runs = {side: [] for side in trees}
    for r in range(rounds + 1):
        for side in ("base", "now") if r % 2 else ("now", "base"):
            cache = f"{tmp}/cache-{side}{r}"
            times = (
                one_sweep(trees[side], f"{tmp}/{side}{r}-sweep", cache)
                if sweep
                else [
                    four_step_run(trees[side], f"{tmp}/{side}{r}-{lr}", f"optim.lr={lr}", f"compile_cache={cache}")[0]
                    for lr in SCREEN_RATES
                ]
            )
            print(side, r, " ".join(f"lr {lr}: {t:.2f} s" for lr, t in zip(SCREEN_RATES, times)), flush=True)
            if r:
                runs[side].append(times)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| side | " + " | ".join(f"lr {lr}" for lr in SCREEN_RATES) + " | later / first |")
    for side in trees:
        medians = [statistics.median(t[i] for t in runs[side]) for i in range(len(SCREEN_RATES))]
        later = statistics.median(t[i] / t[0] for t in runs[side] for i in range(1, len(SCREEN_RATES)))
        print(f"| {side} | " + " | ".join(f"{m:.2f} s" for m in medians) + f" | {later:.2f} |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="ff260d5")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--screen", action="store_true", help="a 3-rate screen sharing a compile cache per round")
    ap.add_argument("--sweep", action="store_true", help="with --screen: the three rates as one sweep (one process)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"base": source_tree(args.base, f"{tmp}/base"), "now": source_tree(None, f"{tmp}/now")}
        if args.screen:
            return screen(trees, args.rounds, tmp, args.sweep)
        runs = {side: [] for side in trees}
        for r in range(args.rounds + 1):
            for side in ("base", "now") if r % 2 else ("now", "base"):
                figures = four_step_run(trees[side], f"{tmp}/{side}{r}")
                print(side, r, " ".join(f"{n} {v:.2f}" for n, v in zip(FIGURES, figures)), flush=True)
                if r:  # round 0 warms the disk cache of both trees
                    runs[side].append(figures)
    print(f"load average {os.getloadavg()[0]:.1f}")
    for i, name in enumerate(FIGURES):
        base, now = ([f[i] for f in runs[side]] for side in ("base", "now"))
        ratios = sorted(n / b for n, b in zip(now, base))
        print(
            f"| {name} | {statistics.median(base):.2f} | {statistics.median(now):.2f} | "
            f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f}) |"
        )


if __name__ == "__main__":
    main()
