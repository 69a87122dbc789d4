"""The default experiment's phases at a base commit and now: compile, final metrics and steps per second.

Each round runs `python -m attnlab` once per side (the defaults, a fixed number of steps, one evaluation at the end,
no periodic checkpoint, no compile cache), the sides back to back in alternating order (bench_common.interleave);
printed are each figure's median and the per-round ratios now / base, median (min-max).

    JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_default_run.py --base ff260d5 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import tempfile

from bench_common import interleave, med, paired_ratio, table
from bench_train import default_run, source_tree

FIGURES = {  # figure -> how it is read from a run's metrics.json
    "compile (s)": lambda m: m["compile_time_s"],
    "final metrics (s)": lambda m: m["timing"]["final_metrics"],
    "train loop (s)": lambda m: m["timing"]["train_loop"],
    "steps per second": lambda m: m["steps_per_sec"],
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="ff260d5", help="the commit the working tree is compared against")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args(argv)
    # one evaluation (at the end) and only the final checkpoint: the phases a short default run pays for
    extra = (f"trainer.eval_every={args.steps}", f"trainer.checkpoint_every={args.steps}")
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {"base": source_tree(args.base, os.path.join(tmp, "base")), "now": source_tree(None, f"{tmp}/now")}
        count = iter(range(10**6))
        samplers = {
            side: lambda side=side: default_run(srcs[side], args.steps, tmp, f"{side}{next(count)}", extra)
            for side in srcs
        }
        runs = interleave(samplers, args.rounds)
    load = os.getloadavg()[0]
    print(f"base {args.base}; {args.rounds} rounds after one discarded; {args.steps} steps; load average {load:.1f}\n")
    rows = []
    for name, read in FIGURES.items():
        base, now = ([read(m) for m in runs[side]] for side in ("base", "now"))
        rows.append([name, f"{med(base):.2f}", f"{med(now):.2f}", paired_ratio(now, base)])
    print("\n".join(table(["figure", "base (median)", "now (median)", "now / base"], rows)))


if __name__ == "__main__":
    main()
