"""Per-run, all-heads summary of attention-logit growth and entropy collapse.

The report's curves show head 0 only; collapse usually hits some heads and not others. For every run under
SWEEP_DIR this reads all scalar events (EventAccumulator, size_guidance 0) of attn_max_logit/layer_i/head_h and
attn_entropy/layer_i/head_h (normalised entropy H/log n) and prints, per layer, the largest max |logit| and the
smallest entropy reached by any head at any logged step, the final mean entropy over heads, and the final
test accuracy; then the same per cell (optim.lr, model.qk_norm) as mean over seeds.

Usage: python summarize.py SWEEP_DIR > collapse.md
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main(sweep: str) -> None:
    rows = []
    for rj in sorted(Path(sweep).rglob("run.json")):
        run = rj.parent
        if not (run / "metrics.json").exists() or not any(run.glob("events.out.tfevents.*")):
            continue
        cfg = json.loads(rj.read_text())["config"]
        m = json.loads((run / "metrics.json").read_text())
        ea = EventAccumulator(str(run), size_guidance={"scalars": 0})
        ea.Reload()
        tags = ea.Tags()["scalars"]
        L, H = cfg["model"]["layers"], cfg["model"]["heads"]
        r = dict(
            lr=cfg["optim"]["lr"],
            qk=cfg["model"]["qk_norm"],
            seed=cfg["seed"],
            status=m["status"],
            nonfinite=m.get("nonfinite_steps"),
            acc=(m.get("final") or {}).get("test/accuracy", float("nan")),
        )
        for layer in range(L):
            ml = [
                e.value
                for h in range(H)
                if (t := f"attn_max_logit/layer_{layer}/head_{h}") in tags
                for e in ea.Scalars(t)
            ]
            ent = [
                [e.value for e in ea.Scalars(t)]
                for h in range(H)
                if (t := f"attn_entropy/layer_{layer}/head_{h}") in tags
            ]
            r[f"maxlogit{layer}"] = max(ml) if ml else float("nan")
            r[f"minent{layer}"] = min(min(e) for e in ent) if ent else float("nan")
            r[f"finalent{layer}"] = float(np.mean([e[-1] for e in ent])) if ent else float("nan")
        rows.append(r)
    if not rows:
        return
    layers = sorted({int(k[len("maxlogit") :]) for r in rows for k in r if k.startswith("maxlogit")})
    head = (
        "| optim.lr | model.qk_norm | seed | status | non-finite | "
        + " | ".join(f"L{i} max \\|logit\\| | L{i} min entropy | L{i} final entropy" for i in layers)
        + " | test/accuracy |"
    )
    print(head)
    print("|" + "---:|" * (5 + 3 * len(layers) + 1))
    for r in sorted(rows, key=lambda r: (r["lr"], r["qk"], r["seed"])):
        cells = " | ".join(f"{r[f'maxlogit{i}']:.3g} | {r[f'minent{i}']:.3f} | {r[f'finalent{i}']:.3f}" for i in layers)
        print(
            f"| {r['lr']:g} | {r['qk']} | {r['seed']} | {r['status']} | {r['nonfinite']} | {cells} | {r['acc']:.3f} |"
        )
    print()
    print("Mean over seeds per cell:\n")
    print(
        "| optim.lr | model.qk_norm | n | "
        + " | ".join(f"L{i} max \\|logit\\| | L{i} min entropy" for i in layers)
        + " | test/accuracy |"
    )
    print("|" + "---:|" * (3 + 2 * len(layers) + 1))
    cells = defaultdict(list)
    for r in rows:
        cells[(r["lr"], r["qk"])].append(r)
    for (lr, qk), rs in sorted(cells.items()):
        c = " | ".join(
            f"{np.mean([r[f'maxlogit{i}'] for r in rs]):.3g} | {np.mean([r[f'minent{i}'] for r in rs]):.3f}"
            for i in layers
        )
        print(f"| {lr:g} | {qk} | {len(rs)} | {c} | {np.mean([r['acc'] for r in rs]):.3f} |")


if __name__ == "__main__":
    main(sys.argv[1])
