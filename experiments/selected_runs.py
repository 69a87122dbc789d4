"""Copy the runs of each cell at its selected rate into one directory, so the final report reads exactly those.

    python experiments/selected_runs.py REPORT_CSV KEY SWEEP_DIR DEST

For each `KEY=value optim.lr=rate` of a screen's report.csv (selected_lrs.py), every run under SWEEP_DIR whose run.json
has that value of KEY and that rate (the screen's seed 0 and the confirm runs' seeds) is copied into DEST without its
checkpoints (named after its path under SWEEP_DIR; the report does not follow symlinks). A report over SWEEP_DIR with
--select-lr would choose again among rates with one seed and the selected rate with three; DEST holds the selected
rate's seeds alone.
"""

import csv
import json
import shutil
import sys
from pathlib import Path


def value(config: dict, choices: dict, key: str):
    """A dotted config key of a run (a group's choice where the key is a group, e.g. normalizer)."""
    if key in choices:
        return choices[key]
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def main(report_csv: str, key: str, sweep: str, dest: str) -> None:
    with open(report_csv, newline="") as f:
        selected = {(r[key], float(r["optim.lr"])) for r in csv.DictReader(f) if r["optim.lr"]}
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    matched = 0
    for run_json in sorted(Path(sweep).rglob("run.json")):
        record = json.loads(run_json.read_text())
        cell = str(value(record["config"], record.get("choices", {}), key))
        if cell.lower() in ("true", "false"):  # a boolean key as the csv writes it
            cell = cell.capitalize()
        if (cell, float(record["config"]["optim"]["lr"])) in selected:
            run = run_json.parent.parent if run_json.parent.name.startswith("seed") else run_json.parent
            copy = out / "_".join(run.relative_to(sweep).parts)
            if not copy.exists():  # copied by an earlier pass (a resumed study) or by the other seed's run.json
                shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints"))
            matched += 1
    if not matched:
        sys.exit(f"selected_runs: no run under {sweep} at the rates {report_csv} selected")


if __name__ == "__main__":
    main(*sys.argv[1:5])
