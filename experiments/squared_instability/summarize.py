"""Per-run instability summary of a squared-attention sweep (seed 004: "the denominator might get to 0").

Reads each run's metrics.json (status, nonfinite_steps, final test accuracy), run.json (normalizer.eps,
normalizer.offset, seed) and its TensorBoard events (every scalar event: EventAccumulator with
size_guidance 0) and prints a markdown table: the smallest attn_min_denominator over all layers, heads
and logged steps, the largest grad_norm/global and score_grad/layer_i, and the step of that gradient spike.

Usage: python summarize.py SWEEP_DIR > instability.md
"""

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    ea.Reload()
    return {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}


def fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.3g}"


def main(sweep: str) -> None:
    rows = []
    for mpath in sorted(Path(sweep).rglob("metrics.json")):
        run = mpath.parent
        if "report" in run.parts or not (run / "run.json").exists():
            continue
        m = json.loads(mpath.read_text())
        cfg = json.loads((run / "run.json").read_text())["config"]
        s = scalars(run)
        dens = [v for t, ev in s.items() if t.startswith("attn_min_denominator/") for _, v in ev]
        g = s.get("grad_norm/global", [])
        sg = [v for t, ev in s.items() if t.startswith("score_grad/layer_") and t.count("/") == 1 for _, v in ev]
        finite_g = [(st, v) for st, v in g if math.isfinite(v)]
        spike = max(finite_g, key=lambda e: e[1]) if finite_g else (None, math.nan)
        rows.append(
            dict(
                eps=cfg["normalizer"]["eps"],
                offset=cfg["normalizer"]["offset"],
                seed=cfg["seed"],
                status=m.get("status"),
                nonfinite=m.get("nonfinite_steps"),
                min_den=min(dens) if dens else math.nan,
                max_g=spike[1],
                max_g_step=spike[0],
                med_g=float(np.median([v for _, v in finite_g])) if finite_g else math.nan,
                max_sg=max((v for v in sg if math.isfinite(v)), default=math.nan),
                acc=(m.get("final") or {}).get("test/accuracy", math.nan),
            )
        )
    print(
        "| eps | offset | seed | status | non-finite steps | min denominator | max grad_norm/global (step) "
        "| median grad_norm/global | max score_grad/layer_i | final test/accuracy |"
    )
    print("|---:|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (-r["eps"], r["offset"], r["seed"])):
        print(
            f"| {r['eps']:g} | {r['offset']} | {r['seed']} | {r['status']} | {r['nonfinite']} | {fmt(r['min_den'])} "
            f"| {fmt(r['max_g'])} ({r['max_g_step']}) | {fmt(r['med_g'])} | {fmt(r['max_sg'])} | {fmt(r['acc'])} |"
        )
    # per-cell totals
    cells = defaultdict(list)
    for r in rows:
        cells[(r["eps"], r["offset"])].append(r)
    print()
    print(
        "| eps | offset | runs | diverged/failed | total non-finite steps | min denominator (all seeds) "
        "| max grad_norm/global (all seeds) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    for (eps, off), rs in sorted(cells.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        bad = sum(r["status"] != "completed" for r in rs)
        print(
            f"| {eps:g} | {off} | {len(rs)} | {bad} | {sum(r['nonfinite'] or 0 for r in rs)} "
            f"| {fmt(min(r['min_den'] for r in rs))} | {fmt(max(r['max_g'] for r in rs))} |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
