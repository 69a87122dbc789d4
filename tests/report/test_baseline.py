"""A baseline is one cell: `--baseline normalizer=softmax` on a sweep with softmax with and without an output gate is
refused in one line naming both cells and how to pick one; KEY=VALUE pairs separated by commas pick it."""

from __future__ import annotations

import json

import pytest
from run_records import write_run

from attnlab.report import cli as report_cli
from attnlab.report import load_runs, summarize
from attnlab.report.cells import baseline_pairs
from attnlab.report.write import to_markdown

CELLS = (("softmax", "none"), ("softmax", "headwise"), ("sigmoid", "none"), ("linear", "none"))
SHIFT = {("softmax", "none"): 0.0, ("softmax", "headwise"): 0.05, ("sigmoid", "none"): -0.1, ("linear", "none"): -0.2}


def gated_sweep(root):
    """softmax ± a head-wise output gate, sigmoid and linear without, 3 seeds each, model.output_gate swept."""
    for i, ((norm, gate), seed) in enumerate((c, s) for c in CELLS for s in range(3)):
        acc = 0.6 + SHIFT[(norm, gate)] + 0.01 * seed * (1 + CELLS.index((norm, gate)))
        final = {"val/loss": 2.0 - acc, "test/accuracy": acc, "test/loss": 2.0 - acc}
        path = write_run(root, f"{i}_normalizer={norm},model.output_gate={gate},seed={seed}", norm, 0.003, seed, final)
        rec = json.loads((path / "run.json").read_text())
        rec["config"]["model"]["output_gate"] = gate
        rec["overrides"].insert(1, f"model.output_gate={gate}")
        (path / "run.json").write_text(json.dumps(rec))
    return root


AMBIGUOUS = (
    "attnlab-report: error: baseline 'normalizer=softmax' matches 2 cells (normalizer=softmax, "
    "model.output_gate=headwise; normalizer=softmax, model.output_gate=none), and normalizer=softmax, "
    "model.output_gate=headwise would be compared with nothing; a baseline is one cell: add the key(s) that tell "
    "them apart, e.g. --baseline normalizer=softmax,model.output_gate=none\n"
)


def test_a_baseline_matching_two_cells_is_refused_in_one_line(tmp_path, capsys):
    gated_sweep(tmp_path)
    assert report_cli.cli([str(tmp_path), "--curves", "--baseline", "normalizer=softmax"]) == 2
    assert capsys.readouterr().err == AMBIGUOUS
    assert not (tmp_path / "report").exists()


def test_a_refusal_names_three_of_many_cells_and_counts_the_rest(tmp_path, capsys):
    """softmax at five gates, sigmoid at one: the message stays a few lines whatever the sweep's size."""
    gates = ("none", "headwise", "elementwise", "g3", "g4")
    for i, (norm, gate) in enumerate([*(("softmax", g) for g in gates), ("sigmoid", "none")]):
        final = {"val/loss": 1.0 + i / 10, "test/accuracy": 0.5, "test/loss": 1.0}
        path = write_run(tmp_path, f"{i}_normalizer={norm},model.output_gate={gate}", norm, 0.003, 0, final)
        rec = json.loads((path / "run.json").read_text())
        rec["config"]["model"]["output_gate"] = gate
        rec["overrides"].insert(1, f"model.output_gate={gate}")
        (path / "run.json").write_text(json.dumps(rec))
    assert report_cli.cli([str(tmp_path), "--curves", "--baseline", "normalizer=softmax"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "matches 5 cells (" in err
    named = "normalizer=softmax, model.output_gate=elementwise; normalizer=softmax, model.output_gate=g3; "
    assert f"({named}normalizer=softmax, model.output_gate=g4; and 2 more), and {named}" in err
    assert "model.output_gate=g4; and 1 more would be compared with nothing" in err


def test_several_pairs_pick_one_cell_and_the_gated_softmax_is_compared_with_it(tmp_path, capsys):
    gated_sweep(tmp_path)
    spec = "normalizer=softmax,model.output_gate=none"
    assert report_cli.cli([str(tmp_path), "--curves", "--baseline", spec]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    table = summarize(load_runs(tmp_path), baseline=spec)
    assert [c.label() for c in table.cells if c.is_baseline] == ["normalizer=softmax, model.output_gate=none"]
    gated = next(c for c in table.cells if c.key == {"normalizer": "softmax", "model.output_gate": "headwise"})
    assert gated.stats["test/accuracy"].n_pairs == 3
    assert gated.stats["test/accuracy"].diff_mean == pytest.approx(0.05 + 0.01)  # seeds 0, 1, 2: +0.05 + 0.01·seed
    assert f"## Comparison against {spec}" in md
    assert "normalizer=softmax, model.output_gate=headwise (better: Δ +0.06" in md


def test_the_default_baseline_is_not_taken_where_it_is_two_cells(tmp_path):
    table = summarize(load_runs(gated_sweep(tmp_path)))
    assert table.baseline is None and not any(c.is_baseline for c in table.cells)
    md = to_markdown(table)
    assert (
        "No baseline: --baseline KEY=VALUE (e.g. normalizer=softmax) names the cell the others are tested against. "
        "The default is not taken: baseline 'normalizer=softmax' matches 2 cells"
    ) in md
    assert "e.g. --baseline normalizer=softmax,model.output_gate=none." in md


def test_a_baseline_per_stratum_stays_allowed(tmp_path):
    """normalizer=softmax at each learning rate: each softmax cell has partners, so it is its rate's baseline."""
    for i, (norm, lr, seed) in enumerate(
        (n, lr, s) for n in ("softmax", "linear") for lr in (1e-3, 3e-3) for s in (0, 1, 2)
    ):
        acc = 0.5 + 0.1 * (norm == "softmax") + 0.01 * seed * (1 + (norm == "linear"))
        write_run(tmp_path, f"{i}", norm, lr, seed, {"val/loss": 1.0, "test/accuracy": acc, "test/loss": 1.0})
    table = summarize(load_runs(tmp_path), baseline="normalizer=softmax")
    assert sum(c.is_baseline for c in table.cells) == 2
    assert all(c.stats["test/accuracy"].n_pairs == 3 for c in table.cells if not c.is_baseline)


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "normalizer=softmax,model.gate=none",
            "baseline 'normalizer=softmax,model.gate=none' must be KEY=VALUE (several separated by commas) with KEY "
            "one of the group keys: normalizer, model.output_gate",
        ),
        (
            "normalizer=softmax,model.output_gate=channel",
            "baseline 'normalizer=softmax,model.output_gate=channel' matches no cell; normalizer values: linear, "
            "sigmoid, softmax; model.output_gate values: headwise, none",
        ),
        ("normalizer=softmax,normalizer=linear", "baseline 'normalizer=softmax,normalizer=linear' names a key twice"),
        ("=softmax", "baseline '=softmax': '=softmax' is not KEY=VALUE"),
    ],
)
def test_a_bad_baseline_is_one_line(tmp_path, capsys, spec, message):
    gated_sweep(tmp_path)
    assert report_cli.cli([str(tmp_path), "--curves", "--baseline", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab-report: error: {message}") and err.count("\n") == 1


def test_baseline_pairs_split_only_where_a_key_follows():
    assert baseline_pairs("normalizer=softmax,model.output_gate=none") == [
        ("normalizer", "softmax"),
        ("model.output_gate", "none"),
    ]
    assert baseline_pairs("task.test_lengths=[64,128]") == [("task.test_lengths", "[64,128]")]
