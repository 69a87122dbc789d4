"""What must have formed (`--formed METRIC>=VALUE`): the verdict opens with the seeds of each cell that met it, a
comparison against a baseline that did not form it in every seed is not tested, seeds split across a threshold are
named one by one, a statistic still moving at the end is flagged; how cells pair with a baseline of several cells;
a title that names the keys; on synthetic run directories."""

from __future__ import annotations

import json

import pytest
from run_records import write_run
from tensorboardX import SummaryWriter

from attnlab.report import cli as report_cli
from attnlab.report import load_runs, summarize
from attnlab.report.comparison import title
from attnlab.run.convergence import still_falling, still_moving

FIRST = "test/attn_first_weight/layer_0"
# per seed 0, 1, 2: softmax forms a first-key sink (>= 0.3) in seed 1 only, sigmoid in all, linear in seed 2 only
FIRST_WEIGHT = {"softmax": [0.258, 0.351, 0.035], "sigmoid": [0.5, 0.6, 0.55], "linear": [0.02, 0.2, 0.31]}
# linear's accuracy splits at 0.5 (seed 1 above); sigmoid is 0.1 below softmax in every seed
ACCURACY = {"softmax": [0.80, 0.82, 0.81], "sigmoid": [0.70, 0.71, 0.72], "linear": [0.45, 0.62, 0.40]}
STATISTIC_CURVES = {"moving": [0.1, 0.2, 0.3, 0.4], "flat": [0.4, 0.4, 0.4, 0.4], "peak": [0.1, 0.7, 0.4, 0.35]}


def sink_sweep(root, curves=None):
    """softmax, sigmoid, linear × 3 seeds; `curves` {(normalizer, seed): name in STATISTIC_CURVES} logs the first-key
    weight's training curve (attn_first_weight/layer_0 at steps 1-4 of trainer.steps 4)."""
    for i, (norm, seed) in enumerate((n, s) for n in FIRST_WEIGHT for s in range(3)):
        acc = ACCURACY[norm][seed]
        final = {"val/loss": 2 - acc, "test/accuracy": acc, "test/loss": 2 - acc, FIRST: FIRST_WEIGHT[norm][seed]}
        path = write_run(root, f"{i}_normalizer={norm},seed={seed}", norm, 0.003, seed, final)
        if curves is not None:
            writer = SummaryWriter(logdir=str(path))
            for step, value in enumerate(STATISTIC_CURVES[curves.get((norm, seed), "flat")], start=1):
                writer.add_scalar("attn_first_weight/layer_0", value, step)
            writer.close()
    return root


def report(root, *args) -> list[str]:
    assert report_cli.cli([str(root), "--curves", "--baseline", "normalizer=softmax", *args]) == 0
    return (root / "report" / "report.md").read_text().splitlines()


def section(md: list[str], heading: str) -> list[str]:
    start = md.index(heading)
    return md[start : next((i for i in range(start + 1, len(md)) if md[i].startswith("## ")), len(md))]


def sentence(md: list[str], metric: str) -> str:
    [line] = [t for t in section(md, "## Verdict") if t.startswith(f"- **{metric}**")]
    return line


def test_a_baseline_that_formed_it_in_1_of_3_seeds_leaves_every_comparison_untested(tmp_path, capsys):
    md = report(sink_sweep(tmp_path), "--formed", f"{FIRST}>=0.3")
    verdict = section(md, "## Verdict")
    assert verdict[2:8] == [
        f"**Formed**: {FIRST}>=0.3 per seed (no run logged a curve of it: whether it still moved is not known), in",
        "- 1 of 3 seeds of normalizer=linear; split: seed 0 0.02, seed 1 0.2, seed 2 0.31",
        "- 3 of 3 seeds of normalizer=sigmoid",
        "- 1 of 3 seeds of normalizer=softmax, the baseline; split: seed 0 0.258, seed 1 0.351, seed 2 0.035",
        "",
        "A comparison is tested only where its baseline formed it in every seed.",
    ]
    assert sentence(md, "test/accuracy") == (
        "- **test/accuracy**: not tested: the baseline formed it in 1 of 3 seeds: normalizer=linear; "
        "normalizer=sigmoid."
    )
    assert "Holm's correction over the 0 (cell, metric) comparison(s)" in "\n".join(verdict)
    ranked = section(md, "## Comparison against normalizer=softmax")
    assert any(
        t.startswith("  3. normalizer=sigmoid: not tested: the baseline formed it in 1 of 3 seeds; 0.71")
        for t in ranked
    )


def test_metrics_left_untested_for_the_same_reason_share_one_line(tmp_path):
    """The reason not to test is the baseline's, the same for every metric: said once, not once per metric."""
    for path in sink_sweep(tmp_path).glob("*/metrics.json"):  # no headline: the verdict covers both metrics
        path.write_text(json.dumps({**json.loads(path.read_text()), "headline": None, "baseline_labels": {}}))
    md = report(tmp_path, "--formed", f"{FIRST}>=0.3", "--metrics", "test/accuracy", "test/loss")
    assert [t for t in section(md, "## Verdict") if t.startswith("- **")] == [
        "- **test/accuracy, test/loss**: not tested: the baseline formed it in 1 of 3 seeds: normalizer=linear; "
        "normalizer=sigmoid."
    ]


def test_a_baseline_that_formed_it_in_every_seed_is_compared_and_formed_in_every_holds_the_cells_to_it(tmp_path):
    sink_sweep(tmp_path)
    md = report(tmp_path, "--formed", f"{FIRST}>=0.03")  # softmax 3 of 3, linear 2 of 3 (seed 0 at 0.02)
    assert "- 3 of 3 seeds of normalizer=softmax, the baseline" in md
    line = sentence(md, "test/accuracy")
    assert "differ from normalizer=softmax beyond seed noise: normalizer=linear (worse: Δ -0.32" in line
    assert "normalizer=sigmoid (worse: Δ -0.1" in line and "not tested" not in line
    md = report(tmp_path, "--formed", f"{FIRST}>=0.03", "--formed-in", "every")
    line = sentence(md, "test/accuracy")
    assert "not tested: normalizer=linear formed it in 2 of 3 seeds: normalizer=linear" in line
    assert "differ from normalizer=softmax beyond seed noise: normalizer=sigmoid" in line
    assert "A comparison is tested only where its baseline and the cell formed it in every seed." in md


def test_seeds_split_across_a_threshold_are_named_never_averaged(tmp_path):
    md = report(sink_sweep(tmp_path), "--formed", "test/accuracy>=0.5", "--metrics", "test/accuracy", FIRST)
    assert "- 1 of 3 seeds of normalizer=linear; split: seed 0 0.45, seed 1 0.62, seed 2 0.4" in md
    line = sentence(md, "test/accuracy")
    # sigmoid is tested (the one test of Holm's family); linear's seeds split: no Δ, no mean of 0.49
    assert line.startswith(
        "- **test/accuracy**: differ from normalizer=softmax beyond seed noise: normalizer=sigmoid (worse: Δ -0.1"
    )
    assert line.endswith(
        "not tested: seeds split at its threshold (normalizer=linear: seed 0 0.45, seed 1 0.62, seed 2 0.4): "
        "normalizer=linear."
    )
    assert "Holm's correction over the 1 (cell, metric) comparison(s)" in "\n".join(md)
    [linear] = [t for t in section(md, "## Comparison against normalizer=softmax") if "normalizer=linear:" in t][:1]
    assert linear.endswith("split: seed 0 0.45, seed 1 0.62, seed 2 0.4") and "0.49" not in linear


def test_a_statistic_still_moving_over_the_last_quarter_is_flagged_per_cell(tmp_path):
    moving = {("sigmoid", 0): "moving", ("sigmoid", 1): "moving", ("linear", 2): "moving"}
    md = report(sink_sweep(tmp_path, moving), "--formed", f"{FIRST}>=0.3")
    verdict = section(md, "## Verdict")
    assert verdict[2] == f"**Formed**: {FIRST}>=0.3 per seed, in"
    assert verdict[4] == (
        "- 3 of 3 seeds of normalizer=sigmoid; still moving over the last quarter of attn_first_weight/layer_0 in "
        "2 of 3 runs"
    )
    assert verdict[3].endswith("in 1 of 3 runs") and "still moving" not in verdict[5]  # softmax: flat


def test_a_condition_on_a_curves_extreme_reads_every_logged_step_of_the_matching_tags(tmp_path):
    """softmax's first-key weight rose to 0.7 and fell back in every seed (its final values split 1 of 3 at 0.3):
    max(...) over training says it formed in 3 of 3, so the cells are compared with it."""
    peaks = {("softmax", 0): "peak", ("softmax", 1): "peak", ("softmax", 2): "peak", ("sigmoid", 0): "peak"}
    md = report(sink_sweep(tmp_path, peaks), "--formed", "max(attn_first_weight/*)>=0.5", "min(attn_first_*)<=0.15")
    verdict = section(md, "## Verdict")
    assert verdict[2:7] == [
        "**Formed**: max(attn_first_weight/*)>=0.5 per seed (max over training of every curve matching "
        "attn_first_weight/*), in",
        "- 0 of 3 seeds of normalizer=linear",
        "- 1 of 3 seeds of normalizer=sigmoid; split: seed 0 0.7, seed 1 0.4, seed 2 0.4",
        "- 3 of 3 seeds of normalizer=softmax, the baseline",
        "",
    ]
    assert verdict[7:11] == [
        "**Formed**: min(attn_first_*)<=0.15 per seed (min over training of every curve matching attn_first_*), in",
        "- 0 of 3 seeds of normalizer=linear",
        "- 1 of 3 seeds of normalizer=sigmoid; split: seed 0 0.1, seed 1 0.4, seed 2 0.4",
        "- 3 of 3 seeds of normalizer=softmax, the baseline",
    ]
    line = sentence(md, "test/accuracy")  # tested: the baseline formed both in every seed
    assert line.startswith("- **test/accuracy**: differ from normalizer=softmax beyond seed noise: normalizer=linear")
    assert "normalizer=sigmoid (worse: Δ -0.1" in line and "not tested" not in line


def test_still_moving_reads_the_last_quarter_in_either_direction():
    rises_early = {s: min(s, 75) / 100 for s in range(0, 101, 5)}  # flat over steps 75-100
    rises_late = {s: max(s - 75, 0) / 100 + 0.5 for s in range(0, 101, 5)}
    falls_late = {s: 1.0 - v for s, v in rises_late.items()}
    assert still_falling({s: -v for s, v in rises_early.items()}, 100)["val_loss_falling"]  # the last half moves
    assert not still_moving(rises_early, 100)
    assert still_moving(rises_late, 100) and still_moving(falls_late, 100)
    assert still_moving({1: 0.1, 2: 0.2}, 100) is None


def gated_sweep(root, cells):
    """`cells` (normalizer, model.output_gate) × 3 seeds; accuracy 0.6, +0.1 with a head-wise gate, +0.05 for
    sigmoid, +0.001·seed·(1 + the cell's index)."""
    for i, ((norm, gate), seed) in enumerate((c, s) for c in cells for s in range(3)):
        acc = (
            0.6
            + 0.1 * (gate == "headwise")
            + 0.05 * (norm == "sigmoid")
            + 0.001 * seed * (1 + cells.index((norm, gate)))
        )
        final = {"val/loss": 2 - acc, "test/accuracy": acc, "test/loss": 2 - acc}
        path = write_run(root, f"{i}_normalizer={norm},model.output_gate={gate},seed={seed}", norm, 0.003, seed, final)
        rec = json.loads((path / "run.json").read_text())
        rec["config"]["model"]["output_gate"] = gate
        rec["overrides"].insert(1, f"model.output_gate={gate}")
        (path / "run.json").write_text(json.dumps(rec))
    return root


PAIRING = (
    "**Pairing**: each cell against normalizer=softmax at its own model.output_gate (2 baseline cells; each comparison "
    "below names its own)."
)


def test_a_baseline_of_several_cells_states_its_pairing_and_names_each_comparisons_baseline(tmp_path):
    cells = [("softmax", "none"), ("softmax", "headwise"), ("sigmoid", "none"), ("sigmoid", "headwise")]
    md = report(gated_sweep(tmp_path, cells + [("sigmoid", "channel")]), "--formed", "test/accuracy>=0.5")
    verdict = section(md, "## Verdict")
    assert verdict.index(PAIRING) > verdict.index(
        "- 3 of 3 seeds of normalizer=softmax, model.output_gate=none, the baseline"
    )
    assert (
        "**Not compared**: no baseline cell has its model.output_gate: normalizer=sigmoid, model.output_gate=channel."
    ) in verdict
    line = sentence(md, "test/accuracy")
    # Δ against its own gate's softmax: +0.05 + 0.001·seed·(4 − 2) headwise, +0.05 + 0.001·seed·(3 − 1) without
    # (against the other gate's softmax: +0.152 and -0.048)
    assert "normalizer=sigmoid, model.output_gate=headwise (better: Δ +0.052 " in line
    assert "normalizer=sigmoid, model.output_gate=none (better: Δ +0.052 " in line
    assert ") against normalizer=softmax, model.output_gate=headwise; " in line
    assert line.endswith(") against normalizer=softmax, model.output_gate=none.")


def test_comparisons_left_untested_are_listed_once_under_each_baseline_cell(tmp_path):
    cells = [("softmax", "none"), ("softmax", "headwise"), ("sigmoid", "none"), ("sigmoid", "headwise")]
    md = report(gated_sweep(tmp_path, cells), "--formed", "test/accuracy>=0.75")  # no cell reaches 0.75
    line = sentence(md, "test/accuracy")
    for gate in ("none", "headwise"):
        assert (
            f"not tested against normalizer=softmax, model.output_gate={gate}: the baseline formed it in 0 of 3 "
            f"seeds: normalizer=sigmoid, model.output_gate={gate}"
        ) in line
    assert line.count("normalizer=softmax") == 2


def test_a_baseline_no_rule_pairs_is_refused_naming_the_keys_that_would(tmp_path, capsys):
    gated_sweep(tmp_path, [("softmax", "none"), ("softmax", "headwise"), ("sigmoid", "none")])
    assert report_cli.cli([str(tmp_path), "--curves", "--baseline", "normalizer=softmax"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "normalizer=softmax, model.output_gate=headwise would be compared with nothing" in err
    )
    assert err.endswith(
        "add the key(s) that tell them apart, e.g. --baseline normalizer=softmax,model.output_gate=none\n"
    )
    assert not (tmp_path / "report").exists()


ALLOWED_OPS = "allowed: METRIC>=VALUE, METRIC<=VALUE, METRIC>VALUE or METRIC<VALUE with VALUE a number, e.g."


@pytest.mark.parametrize(
    "condition, message",
    [
        ("test/accuracy=0.5", f"--formed 'test/accuracy=0.5' is not a condition; {ALLOWED_OPS}"),
        ("test/accuracy>=high", f"--formed 'test/accuracy>=high' is not a condition; {ALLOWED_OPS}"),
        ("test/accuracy>=nan", f"--formed 'test/accuracy>=nan' is not a condition; {ALLOWED_OPS}"),
        (
            "test/attn_sink>=0.3",
            "--formed 'test/attn_sink>=0.3': test/attn_sink is in no completed run's record; allowed: "
            f"test/accuracy, {FIRST}, test/loss, val/loss",
        ),
        (
            "max(attn_sink/*)>=0.3",
            "--formed 'max(attn_sink/*)>=0.3': no completed run logged a curve matching attn_sink/*; allowed: a "
            "pattern of the logged tags, e.g. attn_first_weight/layer_0",
        ),
    ],
)
def test_a_malformed_condition_or_unknown_metric_is_refused_in_one_line(tmp_path, capsys, condition, message):
    sink_sweep(tmp_path, curves={})
    assert report_cli.cli([str(tmp_path), "--curves", "--formed", condition]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab-report: error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "report").exists()


def test_a_title_too_long_for_its_cells_names_the_keys_and_their_values(tmp_path):
    for i, (norm, lr) in enumerate(
        (n, lr) for n in ("softmax", "kl", "linear", "sigmoid") for lr in (1e-3, 3e-3, 1e-2)
    ):
        write_run(tmp_path, str(i), norm, lr, 0, {"val/loss": 1.0, "test/accuracy": 0.5 + i / 100, "test/loss": 1.0})
    table = summarize(load_runs(tmp_path), baseline="normalizer=softmax")
    assert title(table) == "# normalizer: 4 values, optim.lr: 3 values; baseline normalizer=softmax (final parameters)"
    short = summarize(load_runs(tmp_path), group_by=["normalizer"], baseline="normalizer=softmax")
    assert title(short).startswith("# normalizer=kl, normalizer=linear, normalizer=sigmoid against normalizer=softmax")
