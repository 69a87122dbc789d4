"""Recall-capacity tables: MQAR test accuracy per sequence mixer against key-value pairs and against model width.

Reads every run under SWEEP_DIR (attnlab.report.load_runs: completed runs' final test/accuracy) and prints two
Markdown tables, mean ± std over seeds (n): mixers × task.num_kv_pairs at model.d_model = --d-model, and
mixers × model.d_model at task.num_kv_pairs = --pairs. A last row gives the plateau 1/pairs (answering with a
value from the context, not the right one) and, for widths, the linear-attention state per layer
(heads × head_dim², elu+1 features of head_dim each).

Usage: python capacity.py SWEEP_DIR --d-model 64 --pairs 8 > capacity.md
"""

import argparse
import json
from collections import defaultdict

import numpy as np

METRIC = "test/accuracy"


def mixer_name(config: dict) -> str:
    """A readable name of a run's sequence mixer from its flat config."""
    layers = config.get("model.layer_normalizers")
    if isinstance(layers, str):
        layers = json.loads(layers)
    parts = ["/".join(layers) if layers else str(config.get("normalizer"))]
    if config.get("model.short_conv"):
        parts.append(f"short_conv {config['model.short_conv']}")
    if config.get("model.window"):
        parts.append(f"window {config['model.window']}")
    return ", ".join(parts)


def pivot(runs, column: str, fixed: dict) -> tuple[list, dict]:
    """Sorted values of `column`, and {mixer: {value: [metric per completed run]}} over runs matching `fixed`."""
    cells: dict = defaultdict(lambda: defaultdict(list))
    for r in runs:
        v = r.value(METRIC, "final")
        if v is None or any(r.config.get(k) != want for k, want in fixed.items()):
            continue
        cells[mixer_name(r.config)][r.config.get(column)].append(v)
    columns = sorted({c for row in cells.values() for c in row})
    return columns, {m: dict(cells[m]) for m in sorted(cells)}


def cell_text(values: list[float]) -> str:
    if not values:
        return "—"
    std = np.std(values, ddof=1) if len(values) > 1 else float("nan")
    return f"{np.mean(values):.3f} ± {std:.3f} ({len(values)})"


def markdown(title: str, column: str, columns: list, rows: dict, reference: tuple[str, list[str]]) -> str:
    head = "| mixer | " + " | ".join(f"{column}={c}" for c in columns) + " |"
    lines = [f"**{title}**", "", head, "|---|" + "---:|" * len(columns)]
    lines += [
        f"| {m} | " + " | ".join(cell_text(cells.get(c, [])) for c in columns) + " |" for m, cells in rows.items()
    ]
    lines.append(f"| {reference[0]} | " + " | ".join(reference[1]) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    from attnlab.report import load_runs

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir")
    p.add_argument("--d-model", type=int, required=True, help="width of the pairs table")
    p.add_argument("--pairs", type=int, required=True, help="number of key-value pairs of the width table")
    args = p.parse_args(argv)
    runs = load_runs(args.sweep_dir)
    heads = {r.config.get("model.heads") for r in runs} - {None}

    cols, rows = pivot(runs, "task.num_kv_pairs", {"model.d_model": args.d_model})
    print("# Recall capacity (final parameters; mean ± std over seeds (n))\n")
    print(
        markdown(
            f"{METRIC} against task.num_kv_pairs, model.d_model={args.d_model}",
            "pairs",
            cols,
            rows,
            ("plateau 1/pairs", [f"{1 / c:.3f}" for c in cols]),
        )
    )
    cols, rows = pivot(runs, "model.d_model", {"task.num_kv_pairs": args.pairs})
    h = heads.pop() if len(heads) == 1 else None
    state = [f"{h * (c // h) ** 2}" if h else "?" for c in cols]
    print()
    print(
        markdown(
            f"{METRIC} against model.d_model, task.num_kv_pairs={args.pairs} (plateau {1 / args.pairs:.3f})",
            "d_model",
            cols,
            rows,
            ("linear state per layer (heads × head_dim²)", state),
        )
    )


if __name__ == "__main__":
    main()
