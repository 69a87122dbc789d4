"""The query row of max retrieval — the one attention row a run is judged by — at each test length: its max
weight and normalised entropy, at initialisation and after training, per seed, from each run's checkpoint.

attnlab's own test_len/<T>/attn_* statistics average every causal row (the items' rows too, which no loss
trains in a one-layer model), so this reads the query's row alone, from `Transformer.attention_maps` (the
normalizer as at evaluation: adaptive temperature applied where it is `eval`).

Usage: python query_rows.py SWEEP_DIR OUT_DIR   (writes OUT_DIR/query_rows.md, .csv and .png)
"""

from __future__ import annotations

import csv
import json
import operator
import sys
from pathlib import Path

import numpy as np

EXAMPLES = 100  # test examples per length (the first of each length's test split)
CHUNK = 20  # examples per attention_maps call: 20 × 1025² float32 weights ≈ 84 MB


def query_row_stats(maps_BTS: np.ndarray, weights_BT: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max weight, normalised entropy) of each example's query row, the position its loss weights: a causal row
    at position q has q + 1 admissible keys; entropy H(row / Σ row) / log(q + 1), as attnlab's attn_entropy."""
    q_B = weights_BT.argmax(1)
    rows = maps_BTS[np.arange(len(q_B)), q_B].astype(np.float64)
    n_B = q_B + 1
    keys = np.arange(rows.shape[1])[None, :] < n_B[:, None]
    rows = np.where(keys, rows, 0.0)
    p = rows / rows.sum(1, keepdims=True)
    h = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(1)
    return rows.max(1), h / np.log(n_B)


def label(run_json: dict) -> str:
    """The run's configuration, as the report's group-by keys name it."""
    name, norm = run_json["choices"]["normalizer"], run_json["config"]["normalizer"]
    if name == "softmax":
        beta = "learned β" if norm["learnable"] else "fixed β"
        return f"softmax, {beta}" + (", adaptive T (eval)" if norm["adaptive_temperature"] != "off" else "")
    return name


def job_stats(job: Path) -> dict:
    """{(phase, length): (S, 2) per-seed means of (max weight, entropy)} of one vmapped job (init and trained)."""
    import jax
    from flax import nnx
    from omegaconf import OmegaConf

    from attnlab.checkpoint import Checkpoints
    from attnlab.config.assembly import assemble
    from attnlab.train.state import fresh_state

    run = json.loads((job / "seed0" / "run.json").read_text())
    cfg = OmegaConf.create(run["config"])
    task, nets, tx, _ = assemble(cfg, run["choices"]["head"], run["choices"]["normalizer"])
    state = fresh_state(nets, tx, cfg.seed)
    _, saved, _ = Checkpoints(job).restore_latest({"train": state, "best_params": state["params"]})
    out = {}
    for phase, params, rest in (
        ("init", state["params"], state["rest"]),
        ("trained", saved["train"]["params"], saved["train"]["rest"]),
    ):
        for i, net in enumerate(nets):
            graphdef = nnx.split(net, nnx.Param, ...)[0]
            model = nnx.merge(graphdef, *jax.tree.map(operator.itemgetter(i), (params, rest))).body
            for length, at in task.at_lengths.items():
                split = at.splits["test"]
                per = []
                for s in range(0, EXAMPLES, CHUNK):
                    maps = np.asarray(model.attention_maps(split.inputs[s : s + CHUNK], split.valid[s : s + CHUNK]))
                    per.append(np.stack(query_row_stats(maps[0, :, 0], split.weights[s : s + CHUNK]), 1))
                out.setdefault((phase, length), []).append(np.concatenate(per).mean(0))
    return {k: np.array(v) for k, v in out.items()}, label(run)


def table(results: dict, lengths: list[int], phase: str) -> list[str]:
    """Rows: configuration; cells: max weight / entropy, mean ± std over seeds."""
    lines = ["| configuration | " + " | ".join(f"n = {t}" for t in lengths) + " |", "|---|" + "---|" * len(lengths)]
    for name, stats in results.items():
        cells = []
        for t in lengths:
            x = stats[(phase, t)]
            cells.append(f"{x[:, 0].mean():.3f} ± {x[:, 0].std(ddof=1):.3f} / {x[:, 1].mean():.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def draw(results: dict, lengths: list[int], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for name, stats in results.items():
        for col, ax in enumerate(axes):
            (line,) = ax.plot(lengths, [stats[("trained", t)][:, col].mean() for t in lengths], marker="o", label=name)
            init = [stats[("init", t)][:, col].mean() for t in lengths]
            ax.plot(lengths, init, linestyle=":", color=line.get_color())
    for ax, what in zip(axes, ("max weight", "normalised entropy")):
        ax.set(xscale="log", xlabel="items n (trained at 16)", ylabel=f"query row {what}", ylim=(0, 1.02))
        ax.set_xticks(lengths, [str(t) for t in lengths])
        ax.minorticks_off()
    axes[0].set_title("trained (solid) and at initialisation (dotted); mean of 3 seeds", fontsize="small")
    axes[1].legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def cached_job_stats(job: Path) -> tuple[str, dict]:
    """(label, stats) of a job, read once and kept in the job's query_rows.json (a re-run reads it back)."""
    cache = job / "query_rows.json"
    if cache.is_file():
        saved = json.loads(cache.read_text())
        return saved["label"], {(p, int(t)): np.array(v) for p, t, v in saved["stats"]}
    stats, name = job_stats(job)
    cache.write_text(json.dumps({"label": name, "stats": [[p, t, v.tolist()] for (p, t), v in stats.items()]}))
    return name, stats


def main(sweep: str, out_dir: str) -> None:
    jobs = sorted(p.parent for p in Path(sweep).glob("*/*/checkpoints"))
    done = [j for j in jobs if (j / "seed0" / "metrics.json").is_file()]  # a job still training is left out
    for j in sorted(set(jobs) - set(done)):
        print(f"query_rows: {j} has not finished; left out", file=sys.stderr)
    results = dict(sorted(cached_job_stats(j) for j in done))
    lengths = sorted({t for stats in results.values() for _, t in stats})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = [
        f"Max retrieval's query row (trained at 16 items; {EXAMPLES} test examples per length): max weight ± std "
        "over 3 seeds / normalised entropy (mean).",
        "",
        "After training:",
        "",
        *table(results, lengths, "trained"),
        "",
        "At initialisation (the same nets before training):",
        "",
        *table(results, lengths, "init"),
    ]
    (out / "query_rows.md").write_text("\n".join(text) + "\n")
    with open(out / "query_rows.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["configuration", "phase", "length", "seed_index", "max_weight", "entropy"])
        for name, stats in results.items():
            for (phase, t), x in sorted(stats.items()):
                for i, (mw, ent) in enumerate(x):
                    w.writerow([name, phase, t, i, mw, ent])
    draw(results, lengths, out / "query_rows.png")
    print("\n".join(text))


if __name__ == "__main__":
    main(*sys.argv[1:3])
