"""The report's verdict on synthetic run directories: paired t-tests, Holm's correction computed by hand,
identical cells named as such."""

from __future__ import annotations

import math

import numpy as np
import pytest
from run_records import write_run
from scipy import stats

from attnlab.report import cli as report_cli
from attnlab.report import load_runs, summarize
from attnlab.report.paired import comparisons, holm
from attnlab.report.stats import detectable_effect, paired_power, seeds_needed
from attnlab.report.verdict import verdict

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
    assert "Holm's correction over the 3 (cell, metric) comparison(s) tested at family-wise α = 0.05" in text
    assert "scipy.stats.ttest_rel" in text
    [line] = [t for t in text.splitlines() if t.startswith("- **test/accuracy**")]
    i = tested.index(("linear", 0.001))
    lo, hi = rows[("linear", 0.001)].stat.diff_ci
    assert (
        f"differ from normalizer=softmax beyond seed noise: normalizer=linear, optim.lr=0.001 (worse: Δ -0.104 "
        f"[{lo:+.3g}, {hi:+.3g}], p={p[i]:.3g}, Holm-adjusted p={adjusted[i]:.3g})"
    ) in line
    j = tested.index(("kl", 0.003))
    kl = rows[("kl", 0.003)]
    lo, hi = kl.stat.diff_ci  # kl's 95% interval [-0.008, +0.012] reaches past the ±0.01 margin: not resolved
    assert kl.outcome(0.05) == "unresolved" and hi > 0.01
    assert (
        f"not resolved (neither a difference nor equivalence within ±0.01): normalizer=kl, optim.lr=0.003: Δ in "
        f"[{lo:+.3g}, {hi:+.3g}] (Δ +0.002, Holm-adjusted p={adjusted[j]:.3g}; these 5 seeds detect |Δ| >= "
        f"{kl.detectable:.3g} at 80% power, the observed Δ needs {kl.needed} seeds)"
    ) in line
    assert (
        "identical to it (every seed, every metric equal to float tolerance: one computation): "
        "normalizer=kl, optim.lr=0.001" in line
    )
    assert line.index("differ from") < line.index("not resolved") < line.index("identical to it")


def test_the_report_opens_with_the_verdict_and_never_shows_an_identical_cell_as_delta_0(tmp_path, capsys):
    sweep(tmp_path)
    report_cli.main([str(tmp_path), "--baseline", "normalizer=softmax", "--curves", "--out", str(tmp_path / "rep")])
    md = (tmp_path / "rep" / "report.md").read_text().splitlines()
    assert md[2].startswith("30 of 30 runs completed") and md[4] == "## Verdict"
    kl = [t for t in md if "normalizer=kl, optim.lr=0.001:" in t]
    assert kl and all("identical to the baseline" in t and "Δ" not in t for t in kl)
    assert md.index("## Verdict") < md.index("## Comparison against normalizer=softmax")


def test_a_stricter_alpha_moves_a_cell_out_of_differs(tmp_path, capsys):
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
    assert line.count("not resolved") == 1 and line.count("; normalizer=") == 1  # two cells not resolved now


EQUIVALENT = [0.001, -0.002, 0.0015, -0.0005, 0.001]  # kl at lr 0.003 within a hair of softmax, seed by seed


def close_sweep(root, shift=EQUIVALENT):
    """softmax and kl at one learning rate, kl shifted by `shift` seed by seed."""
    for seed in SEEDS:
        for i, (norm, acc) in enumerate((("softmax", BASE[0.003][seed]), ("kl", BASE[0.003][seed] + shift[seed]))):
            final = {"val/loss": 2.0 - acc, "test/accuracy": acc, "test/loss": 2.0 - acc}
            write_run(root, f"{2 * seed + i}_{norm}_{seed}", norm, 0.003, seed, final)
    return root


def hand_tost(d, m):
    """Schuirmann's two one-sided tests as two scipy one-sample t-tests: H0 mean <= −m, H0 mean >= +m."""
    return max(
        stats.ttest_1samp(d, -m, alternative="greater").pvalue, stats.ttest_1samp(d, m, alternative="less").pvalue
    )


def hand_power(effect, sd, n, alpha):
    """Two-sided paired t-test power from the noncentral t distribution (Cohen 1988, ch. 2)."""
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    nc = effect / sd * math.sqrt(n)
    return stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc)


def test_a_cell_within_the_margin_is_equivalent_by_two_one_sided_tests(tmp_path):
    table = summarize(load_runs(close_sweep(tmp_path)))  # the default baseline: softmax
    [acc] = comparisons(table, "normalizer=softmax")  # the task's headline metric only
    d = np.array(EQUIVALENT)
    assert acc.stat.diff_mean == pytest.approx(d.mean())
    assert acc.margin == 0.01  # accuracy's default: one percentage point
    assert acc.tost == pytest.approx(hand_tost(d, 0.01), rel=1e-9)
    assert acc.tost_adjusted == acc.tost  # Holm over a family of one
    assert acc.outcome(0.05) == "equivalent" and acc.adjusted > 0.05
    lo, hi = acc.stat.diff_ci
    [line] = [t for t in verdict(table) if t.startswith("- **test/accuracy**")]
    assert line == (
        f"- **test/accuracy**: equivalent to it within the margin: normalizer=kl (within ±0.01: Δ {d.mean():+.3g} "
        f"[{lo:+.3g}, {hi:+.3g}], TOST Holm-adjusted p={acc.tost_adjusted:.3g})."
    )


def test_a_narrower_margin_leaves_the_same_cell_not_resolved(tmp_path, capsys):
    close_sweep(tmp_path)
    d = np.array(EQUIVALENT)
    assert hand_tost(d, 0.001) > 0.05  # the margin the researcher asks for is tighter than these seeds resolve
    report_cli.main([str(tmp_path), "--curves", "--out", str(tmp_path / "rep"), "--margin", "test/acc*=0.001"])
    out = capsys.readouterr().out
    line = next(t for t in out.splitlines() if t.startswith("- **test/accuracy**"))
    assert "not resolved (neither a difference nor equivalence within ±0.001): normalizer=kl: Δ in [" in line
    assert "the margin (test/accuracy ±0.001; --margin METRIC=VALUE sets one)" in out  # the method names it


@pytest.mark.parametrize(
    "given, message",
    [
        (
            "test/accuracy",
            "--margin 'test/accuracy'; allowed: METRIC=VALUE with VALUE a positive number, e.g. test/accuracy=0.02",
        ),
        (
            "test/accuracy=-1",
            "--margin 'test/accuracy=-1'; allowed: METRIC=VALUE with VALUE a positive number, e.g. test/accuracy=0.02",
        ),
        ("test/bleu=0.1", "--margin metric 'test/bleu' matches nothing; available: test/accuracy, test/loss"),
    ],
)
def test_a_bad_margin_is_one_line_naming_what_is_allowed(tmp_path, capsys, given, message):
    close_sweep(tmp_path)
    assert report_cli.cli([str(tmp_path), "--curves", "--margin", given]) == 2
    assert capsys.readouterr().err == f"attnlab-report: error: {message}\n"


def test_power_matches_the_noncentral_t_and_a_simulation():
    # G*Power's reference point: d = 1, n = 10, two-sided α = 0.05 gives power 0.8031 (Faul et al. 2007)
    assert paired_power(1.0, 1.0, 10, 0.05) == pytest.approx(0.8031, abs=1e-4)
    for sd, n, alpha in ((0.02, 3, 0.05), (0.01, 5, 0.05 / 3), (1.5, 8, 0.01)):
        effect = detectable_effect(sd, n, alpha)
        assert hand_power(effect, sd, n, alpha) == pytest.approx(0.8, abs=1e-9)
        # and by simulation: paired differences N(effect, sd), the t-test's rejection rate at that effect
        d = np.random.default_rng(n).normal(effect, sd, (100_000, n))
        t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
        assert np.mean(np.abs(t) > stats.t.ppf(1 - alpha / 2, n - 1)) == pytest.approx(0.8, abs=0.01)


def test_seeds_needed_is_the_first_count_that_reaches_80_percent():
    for effect, sd, alpha in ((0.002, 0.0115, 0.05 / 3), (0.05, 0.04, 0.05), (1.0, 1.0, 0.05)):
        n = seeds_needed(effect, sd, alpha)
        assert hand_power(effect, sd, n, alpha) >= 0.8 > hand_power(effect, sd, n - 1, alpha)
    assert seeds_needed(1.0, 1.0, 0.05) == 10  # G*Power: total sample size 10 for d = 1
    assert seeds_needed(1e-6, 1.0, 0.05) is None  # beyond MAX_SEEDS
