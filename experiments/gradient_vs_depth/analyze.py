"""Early-training gradient at the attention scores, first vs last layer, per depth and normalizer.

Seed 001 claims softmax "is used to prevent exploding gradient or vanishing gradient problems". If so, the
gradient reaching the first layer's scores should stay comparable to the last layer's as depth grows under
softmax, and shrink or blow up under the other normalizers.

For every run under SWEEP_DIR (a directory holding run.json + TensorBoard events) this reads every scalar
event (EventAccumulator, size_guidance 0), averages over the logged steps ≤ --early-steps
  score_grad/layer_0, score_grad/layer_{L-1}  (‖∂L/∂scores‖ of the first and last layer, all heads)
  grad_norm/layer_0,  grad_norm/layer_{L-1}   (parameter-gradient norm of the first and last block)
takes the mean over seeds, and prints a markdown table with the ratios first/last.

Usage: python analyze.py SWEEP_DIR [--early-steps 50] [--csv out.csv]
"""

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def early_mean(ea: EventAccumulator, tag: str, max_step: int) -> float:
    if tag not in ea.Tags()["scalars"]:
        return math.nan
    vals = [e.value for e in ea.Scalars(tag) if e.step <= max_step and math.isfinite(e.value)]
    return float(np.mean(vals)) if vals else math.nan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep")
    p.add_argument("--early-steps", type=int, default=50)
    p.add_argument("--csv")
    args = p.parse_args()

    per_cell = defaultdict(list)
    for rj in sorted(Path(args.sweep).rglob("run.json")):
        run = rj.parent
        if not any(run.glob("events.out.tfevents.*")):
            continue
        cfg = json.loads(rj.read_text())
        layers = cfg["config"]["model"]["layers"]
        norm = cfg["choices"]["normalizer"]
        ea = EventAccumulator(str(run), size_guidance={"scalars": 0})
        ea.Reload()
        last = layers - 1
        per_cell[(layers, norm)].append(
            dict(
                sg_first=early_mean(ea, "score_grad/layer_0", args.early_steps),
                sg_last=early_mean(ea, f"score_grad/layer_{last}", args.early_steps),
                gn_first=early_mean(ea, "grad_norm/layer_0", args.early_steps),
                gn_last=early_mean(ea, f"grad_norm/layer_{last}", args.early_steps),
                gn_global=early_mean(ea, "grad_norm/global", args.early_steps),
            )
        )

    def f(x):
        return "–" if not math.isfinite(x) else f"{x:.3g}"

    rows = []
    for (layers, norm), rs in sorted(per_cell.items()):
        m = {k: float(np.nanmean([r[k] for r in rs])) for k in rs[0]}
        ratio_sg = m["sg_first"] / m["sg_last"] if m["sg_last"] else math.nan
        ratio_gn = m["gn_first"] / m["gn_last"] if m["gn_last"] else math.nan
        rows.append((layers, norm, len(rs), m, ratio_sg, ratio_gn))

    print(
        f"Mean over logged steps ≤ {args.early_steps}, then over seeds (n). score_grad = ‖∂loss/∂scores‖ of a layer "
        "(all heads); grad_norm = parameter-gradient norm of a block.\n"
    )
    print(
        "| layers | normalizer | n | score_grad first | score_grad last | first/last | grad_norm first "
        "| grad_norm last | first/last | grad_norm global |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layers, norm, n, m, rsg, rgn in rows:
        print(
            f"| {layers} | {norm} | {n} | {f(m['sg_first'])} | {f(m['sg_last'])} | {f(rsg)} | {f(m['gn_first'])} "
            f"| {f(m['gn_last'])} | {f(rgn)} | {f(m['gn_global'])} |"
        )
    if args.csv:
        with open(args.csv, "w") as fh:
            fh.write(
                "layers,normalizer,n,score_grad_first,score_grad_last,score_ratio,grad_norm_first,grad_norm_last,"
                "grad_ratio,grad_norm_global\n"
            )
            for layers, norm, n, m, rsg, rgn in rows:
                fh.write(
                    f"{layers},{norm},{n},{m['sg_first']},{m['sg_last']},{rsg},{m['gn_first']},{m['gn_last']},"
                    f"{rgn},{m['gn_global']}\n"
                )


if __name__ == "__main__":
    main()
