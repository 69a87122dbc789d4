"""The report's verdict on synthetic run directories: paired t-tests, Holm's correction computed by hand,
identical cells named as such."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from test_report import write_run

from attnlab.report import cli as report_cli
from attnlab.report import load_runs, summarize
from attnlab.report.verdict import comparisons, holm, verdict

SEEDS = range(5)
BASE = {0.001: [0.50, 0.52, 0.48, 0.51, 0.49], 0.003: [0.60, 0.61, 0.59, 0.62, 0.58]}
SHIFT = {
    ("kl", 0.001): None,  # the same computation as softmax
    ("kl", 0.003): [0.01, -0.02, 0.015, -0.005, 0.01],
    ("linear", 0.001): [-0.10, -0.12, -0.09, -0.11, -0.10],
    ("linear", 0.003): [0.02, 0.03, 0.01, 0.025, 0.015],
}


def accuracy(norm, lr, seed):
    shift = SHIFT.get((norm, lr))
    return BASE[lr][seed] + (shift[seed] if shift else 0.0)


def sweep(root):
    i = 0
    for norm in ("softmax", "kl", "linear"):
        for lr in BASE:
            for seed in SEEDS:
                acc = accuracy(norm, lr, seed)
                # kl at lr 0.001 differs from softmax by float32 rounding only, as kl with a uniform prior does
                wobble = 1e-7 if (norm, lr) == ("kl", 0.001) else 0.0
                final = {"val/loss": 2.0 - acc + wobble, "test/accuracy": acc, "test/loss": 2.0 - acc - wobble}
                write_run(root, f"{i}_{norm}_{lr}_{seed}", norm, lr, seed, final)
                i += 1
    return root


def hand_holm(p):
    """Holm (1979) step-down, written out: sort, multiply the k-th smallest by m − k + 1, keep it monotone."""
    m = len(p)
    order = np.argsort(p)
    adjusted = np.empty(m)
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * p[i]))
        adjusted[i] = running
    return adjusted


def test_holm_matches_a_worked_example():
    # sorted 0.01, 0.03, 0.04 → 3·0.01, 2·0.03, max(0.06, 1·0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    p = list(np.random.default_rng(0).uniform(0, 0.2, 7))
    assert holm(p) == pytest.approx(list(hand_holm(p)))


@pytest.mark.parametrize("given", [True, False])
def test_the_verdict_names_what_differs_after_holm_and_what_is_identical(tmp_path, given):
    table = summarize(load_runs(sweep(tmp_path)), baseline="normalizer=softmax" if given else None)
    rows = {(c.cell.key["normalizer"], c.cell.key["optim.lr"]): c for c in comparisons(table, "normalizer=softmax")}
    tested = [k for k in SHIFT if SHIFT[k] is not None]
    p = np.array(
        [
            stats.ttest_rel([accuracy(*k, s) for s in SEEDS], [accuracy("softmax", k[1], s) for s in SEEDS]).pvalue
            for k in tested
        ]
    )
    adjusted = hand_holm(p)
    assert [rows[k].stat.p for k in tested] == pytest.approx(p, rel=1e-9)
    assert [rows[k].adjusted for k in tested] == pytest.approx(adjusted, rel=1e-9)
    assert rows[("kl", 0.001)].same and not rows[("kl", 0.001)].tested()
    assert math.isnan(rows[("kl", 0.001)].adjusted)
    differ = {k for k, a in zip(tested, adjusted) if a <= 0.05}
    assert differ == {("linear", 0.001), ("linear", 0.003)}  # kl at 0.003 is within seed noise

    text = "\n".join(verdict(table))
    assert "Holm's correction over the 3 (cell, metric) comparison(s) tested, at family-wise α = 0.05" in text
    assert "scipy.stats.ttest_rel" in text
    [line] = [t for t in text.splitlines() if t.startswith("- **test/accuracy**")]
    i = tested.index(("linear", 0.001))
    assert (
        f"differ from normalizer=softmax beyond seed noise: normalizer=linear, optim.lr=0.001 (worse: Δ -0.104, "
        f"p={p[i]:.3g}, Holm-adjusted p={adjusted[i]:.3g})"
    ) in line
    j = tested.index(("kl", 0.003))
    assert (
        f"indistinguishable from it at this level: normalizer=kl, optim.lr=0.003 (Δ +0.002, Holm-adjusted "
        f"p={adjusted[j]:.3g})"
    ) in line
    assert (
        "identical to it (every seed, every metric equal to float tolerance: one computation): "
        "normalizer=kl, optim.lr=0.001" in line
    )
    assert line.index("differ from") < line.index("indistinguishable") < line.index("identical to it")


def test_the_report_opens_with_the_verdict_and_never_shows_an_identical_cell_as_delta_0(tmp_path, capsys):
    sweep(tmp_path)
    report_cli.main([str(tmp_path), "--baseline", "normalizer=softmax", "--curves", "--out", str(tmp_path / "rep")])
    md = (tmp_path / "rep" / "report.md").read_text().splitlines()
    assert md[2].startswith("30 of 30 runs completed") and md[4] == "## Verdict"
    kl = [t for t in md if "normalizer=kl, optim.lr=0.001:" in t]
    assert kl and all("identical to the baseline" in t and "Δ" not in t for t in kl)
    assert md.index("## Verdict") < md.index("## Comparison")


def test_a_stricter_alpha_moves_a_cell_to_indistinguishable(tmp_path, capsys):
    sweep(tmp_path)
    table = summarize(load_runs(tmp_path), baseline="normalizer=softmax")
    rows = comparisons(table, "normalizer=softmax")
    smallest_rejected = max(c.adjusted for c in rows if c.tested() and c.adjusted <= 0.05)
    report_cli.main([str(tmp_path), "--curves", "--out", str(tmp_path / "rep"), "--alpha", f"{smallest_rejected / 2}"])
    out = capsys.readouterr().out
    assert f"family-wise α = {smallest_rejected / 2:g}" in out
    assert "(the default; --baseline KEY=VALUE picks another)" in out
    line = next(t for t in out.splitlines() if t.startswith("- **test/accuracy**"))
    assert line.count("Holm-adjusted") == 3 and "differ from" in line and "worse" in line
