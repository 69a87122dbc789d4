"""Which values of a metric are better: a loss or accuracy by its name, an attention statistic as its runs recorded it
in metrics.json's `directions` (attnlab.statistics declares it; None: it describes, neither is better).
A statistic without a direction is never called better or worse, nor ranked, nor used to select a rate."""

from __future__ import annotations

import pytest
from run_records import write_run

from attnlab.report import cli as report_cli
from attnlab.report import load_runs, summarize
from attnlab.report.stats import direction, statistic_of
from attnlab.report.verdict import verdict

SEEDS = range(5)
NOISE = [0.002, -0.001, 0.0, 0.001, -0.002]
# as statistics.directions() writes them, with one declared direction to show that a recorded one is read
DIRECTIONS = {"attn_first_weight": None, "attn_sink_rate": None, "attn_entropy": "higher"}
FIRST, HEAD, RATE, ENTROPY = (
    "test/attn_first_weight/layer_0",
    "test/attn_first_weight/layer_0/head_1",
    "test/attn_sink_rate",
    "test/attn_entropy/layer_0",
)


def final(normalizer: str, seed: int) -> dict:
    shift = 0.2 if normalizer == "kl" else 0.0  # kl: more weight on the first key, lower loss
    e = NOISE[seed] * (1.5 if normalizer == "kl" else 1.0)  # paired differences that vary
    return {
        "val/loss": 1.0 - shift + e,
        "test/loss": 1.0 - shift + e,
        "test/accuracy": 0.5 + shift + e,
        FIRST: 0.3 + shift + e,
        HEAD: 0.25 + shift + e,
        RATE: 0.5 + shift - e,
        ENTROPY: 0.7 - shift + e,
    }


def sweep(root, directions: dict | None = DIRECTIONS, lrs=(0.001,)):
    i = 0
    for norm in ("softmax", "kl"):
        for lr in lrs:
            for seed in SEEDS:
                extra = {} if directions is None else {"directions": directions}
                write_run(root, f"{i}_{norm}_{lr}_{seed}", norm, lr, seed, final(norm, seed), extra=extra)
                i += 1
    return root


def entry(md: list[str], metric: str) -> tuple[str, list[str]]:
    """A metric's heading line in the comparison and its cells' lines."""
    i = next(i for i, line in enumerate(md) if line.startswith(f"- **{metric}** "))
    cells = []
    for line in md[i + 1 :]:
        if not line.startswith("  "):
            break
        cells.append(line)
    return md[i], cells


def report(root, *args) -> list[str]:
    metrics = ["test/loss", "test/accuracy", "test/attn_*"]
    assert report_cli.cli([str(root), "--metrics", *metrics, "--baseline", "normalizer=softmax", *args]) == 0
    return (root / "report" / "report.md").read_text().splitlines()


def test_a_statistic_has_no_better_direction_and_a_loss_keeps_its_own(tmp_path, capsys):
    md = report(sweep(tmp_path))
    for metric in (FIRST, HEAD, RATE):
        head, cells = entry(md, metric)
        assert head == f"- **{metric}** (no better direction; highest first)"
        assert [c.split(":")[0] for c in cells] == ["  - normalizer=kl", "  - normalizer=softmax"]  # unranked
    assert entry(md, "test/loss")[0] == "- **test/loss** (lower is better)"
    assert entry(md, "test/loss")[1][0].startswith("  1. normalizer=kl")
    assert entry(md, "test/accuracy")[0].startswith("- **test/accuracy** (higher is better")
    head, cells = entry(md, ENTROPY)  # a direction a run recorded is the one the report uses
    assert head == f"- **{ENTROPY}** (higher is better)" and cells[0].startswith("  1. normalizer=softmax")
    for line in md:
        if any(m in line for m in (FIRST, HEAD, RATE)):
            assert "is better" not in line and "better:" not in line and "worse:" not in line, line


def test_the_verdict_on_a_statistic_says_higher_or_lower_never_better_or_worse(tmp_path):
    runs = load_runs(sweep(tmp_path))
    for r in runs:  # no headline: the verdict covers every metric of the table
        r.headline, r.baseline_labels = None, {}
    table = summarize(runs, metrics=["test/loss", FIRST, RATE], baseline="normalizer=softmax")
    lines = {m: line for line in verdict(table) if line.startswith("- **") for m in line.split("**")[1].split(", ")}
    assert "normalizer=kl (better: Δ -0.2" in lines["test/loss"]
    assert "normalizer=kl (higher: Δ +0.2" in lines[FIRST]
    for metric in (FIRST, RATE):
        assert "better" not in lines[metric] and "worse" not in lines[metric], lines[metric]


def test_a_run_recorded_without_directions_gives_its_statistics_none(tmp_path, capsys):
    md = report(sweep(tmp_path, directions=None))
    for metric in (FIRST, ENTROPY):
        assert entry(md, metric)[0] == f"- **{metric}** (no better direction; highest first)"
    assert entry(md, "test/loss")[0] == "- **test/loss** (lower is better)"
    runs = load_runs(tmp_path)
    assert all(r.directions == {} for r in runs)
    assert direction(ENTROPY, runs) is None and direction("test/loss", runs) == "lower"


def test_runs_that_disagree_or_none_give_no_direction(tmp_path):
    runs = load_runs(sweep(tmp_path))
    assert direction(ENTROPY, runs) == "higher" and direction("test_len/32/attn_entropy/layer_0", runs) == "higher"
    assert direction(FIRST, runs) is None and direction("test/attn_value_drain/layer_0", runs) is None  # unrecorded
    runs[0].directions = {}  # a run recorded before directions were
    assert direction(ENTROPY, runs) is None
    assert direction(ENTROPY, []) is None  # no run: no direction for a statistic
    assert direction("val/accuracy", []) == "higher"
    assert statistic_of("test_len/32/attn_entropy/layer_0") == "attn_entropy" and statistic_of("test/loss") is None


def test_a_statistic_selects_no_learning_rate(tmp_path, capsys):
    root = sweep(tmp_path, lrs=(0.001, 0.003))
    args = ["--select-lr", "--group-by", "normalizer", "--select-by", "test/attn_sink_rate"]
    assert report_cli.cli([str(root), *args]) != 0
    assert "test/attn_sink_rate has no better direction" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no better direction"):
        summarize(load_runs(root), group_by=["normalizer"], select_lr=True, select_by=RATE)
