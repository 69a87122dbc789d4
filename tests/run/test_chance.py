"""Results that cannot be told from chance are flagged: the binomial threshold against an exact sum, a real
run's summary and record, and the report's mark."""

from __future__ import annotations

import json
import math

from cli_helpers import TINY, metrics, tiny_task, train_in_process
from run_records import write_run

from attnlab.report import cli as report_cli
from attnlab.run import chance


def exact_threshold(p0: float, n: int, level: float = 0.975) -> float:
    """The smallest k/n whose Binomial(n, p0) CDF reaches `level`: the pmf summed term by term (log-space float64)."""
    cdf = 0.0
    for k in range(n + 1):
        cdf += math.exp(
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + k * math.log(p0)
            + (n - k) * math.log1p(-p0)
        )
        if cdf >= level:
            return k / n
    return 1.0


def test_threshold_is_the_binomial_percentile_and_flags_a_run_at_chance():
    for p0, n in ((1 / 32, 4000), (0.125, 80), (0.5, 31)):
        assert chance.threshold(p0, n) == exact_threshold(p0, n)
    # an lr=10 run: accuracy 0.032 against chance 1/32 over 4000 targets cannot be told from chance
    base = {"baseline/accuracy": 1 / 32}
    assert chance.flags({"test/accuracy": 0.032}, base, 4000)["test/accuracy"]["within_noise"]
    assert not chance.flags({"test/accuracy": 0.05}, base, 4000)["test/accuracy"]["within_noise"]
    assert chance.flags({"test/r2": 0.1}, {}, 4000) == {}  # no accuracy baseline, no flag


def test_an_untrained_run_is_flagged_in_its_summary_and_record(tmp_path):
    """Four steps cannot learn MQAR: the test accuracy is chance-level and the summary says so."""
    proc = train_in_process(*TINY, *tiny_task("mqar"), f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    m = metrics(tmp_path / "r")
    flag = m["chance"]["test/accuracy"]
    n = 40 * 2  # task.n_test examples × task.num_kv_pairs queries, each one scored target
    assert (flag["n"], flag["baseline"]) == (n, m["baseline"]["baseline/accuracy"])
    assert flag["threshold"] == exact_threshold(flag["baseline"], n)
    assert flag["within_noise"] == (m["final"]["test/accuracy"] <= flag["threshold"]) is True
    line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("test/accuracy "))
    assert "≈chance" in line and f"n={n}" in line


def test_report_marks_cells_within_noise_of_the_baseline(tmp_path, capsys):
    for i, (norm, acc) in enumerate([("softmax", 0.9), ("softmax", 0.92), ("kl", 0.13), ("kl", 0.12)]):
        run = write_run(tmp_path, f"{i}_{norm}", norm, 0.001, i % 2, {"test/accuracy": acc})
        record = json.loads((run / "metrics.json").read_text())
        record["chance"] = chance.flags(record["final"], {"baseline/accuracy": 0.125}, 80)
        (run / "metrics.json").write_text(json.dumps(record))
    assert report_cli.cli([str(tmp_path), "--curves"]) == 0
    rows = {ln.split("|")[1].strip(): ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")}
    assert "≈chance" in rows["kl"] and "≈chance" not in rows["softmax"]
    assert "$\\approx$chance" in (tmp_path / "report" / "report.tex").read_text()


def test_below_chance_is_said_as_below_chance_in_the_summary_flag_and_the_report(tmp_path, capsys):
    """0.006 against chance 1/32 over 4000 targets is worse than guessing, not ≈chance."""
    base, n = {"baseline/accuracy": 1 / 32}, 4000
    lower = exact_threshold(1 / 32, n, level=0.025)  # the 2.5% point, the pmf summed term by term
    assert chance.lower_threshold(1 / 32, n) == lower
    flag = chance.flags({"test/accuracy": 0.006}, base, n)["test/accuracy"]
    assert flag["below"] and flag["lower"] == lower
    assert chance.describe(flag).startswith(f"below chance (< {lower:.4f}: 2.5% point of Binomial(n=4000")
    at = chance.flags({"test/accuracy": 0.032}, base, n)["test/accuracy"]
    assert not at["below"] and chance.describe(at).startswith("≈chance")
    assert chance.describe(chance.flags({"test/accuracy": 0.05}, base, n)["test/accuracy"]) == ""
    for i, (norm, acc) in enumerate([("softmax", 0.006), ("softmax", 0.007), ("kl", 0.03), ("kl", 0.033)]):
        run = write_run(tmp_path, f"{i}_{norm}", norm, 0.001, i % 2, {"test/accuracy": acc})
        record = json.loads((run / "metrics.json").read_text())
        record["chance"] = chance.flags(record["final"], base, n)
        if norm == "softmax":  # a record from before the lower point was kept: the report derives it
            record["chance"]["test/accuracy"] = {
                k: v for k, v in record["chance"]["test/accuracy"].items() if k not in ("lower", "below")
            }
        (run / "metrics.json").write_text(json.dumps(record))
    assert report_cli.cli([str(tmp_path), "--curves"]) == 0
    rows = {ln.split("|")[1].strip(): ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")}
    assert "below chance" in rows["softmax"] and "≈chance" not in rows["softmax"]
    assert "≈chance" in rows["kl"] and "below chance" not in rows["kl"]
