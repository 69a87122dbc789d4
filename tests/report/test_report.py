"""attnlab.report on fake sweep directories written by hand (no training), plus one real tiny sweep (slow)."""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from run_records import write_run
from scipy import stats

from attnlab import report
from attnlab.report import Run, load_runs, summarize
from attnlab.report import cli as report_cli
from attnlab.report.plots import curve
from attnlab.report.tables import to_latex
from attnlab.report.write import write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def grid_sweep(root: Path, norms=("softmax", "kl"), lrs=(0.001, 0.003), seeds=(0, 1, 2), skip=(), value=None):
    """A full grid of completed runs with reproducible metrics; `skip` holds (norm, lr, seed) not written."""
    rng = np.random.default_rng(7)
    for i, (n, lr, s) in enumerate(itertools.product(norms, lrs, seeds)):
        acc = value(n, lr, s) if value else 0.5 + 0.1 * norms.index(n) + 0.05 * rng.standard_normal()
        final = {
            "val/loss": 2.0 - acc + 0.01 * rng.standard_normal(),
            "test/accuracy": acc,
            "test/loss": 2.0 - acc,
            "test/accuracy_ts": acc,
            "test/temperature": 1.3,
        }
        if (n, lr, s) not in skip:
            write_run(root, f"{i}_{n}_mqar_seed{s}", n, lr, s, final)
    return root


def on_disk(root: Path, metric: str, which="final", status="completed") -> dict[tuple, list[float]]:
    """metric values per (normalizer, lr), straight from the JSON files (independent of attnlab.report)."""
    out: dict[tuple, list[float]] = {}
    for p in sorted(root.iterdir()):
        if not (p / "run.json").exists():
            continue
        m, r = json.loads((p / "metrics.json").read_text()), json.loads((p / "run.json").read_text())
        if m["status"] == status:
            out.setdefault((r["choices"]["normalizer"], r["config"]["optim"]["lr"]), []).append(m[which][metric])
    return out


def cell(table, **key):
    [c] = [c for c in table.cells if all(c.key.get(k) == v for k, v in key.items())]
    return c


@pytest.fixture
def mixed(tmp_path):
    """2 normalizers × 2 lrs × 3 seeds, with one diverged run, two failed-before-training runs."""
    grid_sweep(tmp_path, skip={("softmax", 0.003, 1), ("kl", 0.003, 2)})
    bad = {"val/loss": 99.0, "test/accuracy": 0.0, "test/loss": 99.0}  # must never enter a mean
    write_run(tmp_path, "20_softmax_mqar_seed1", "softmax", 0.003, 1, bad, status="diverged")
    write_run(tmp_path, "21_kl_mqar_seed2", "kl", 0.003, 2, None, status="failed", record="hydra")
    write_run(tmp_path, "22_kl_mqar_seed2", "kl", 0.003, 2, None, status="failed", record="none")
    return tmp_path


def test_load_runs_reads_every_run_and_flattens_the_config(mixed):
    runs = load_runs(mixed)
    assert len(runs) == 12 - 2 + 3
    assert [r.path.name for r in runs][:3] == ["0_softmax_mqar_seed0", "1_softmax_mqar_seed1", "2_softmax_mqar_seed2"]
    kl = next(r for r in runs if r.path.name == "6_kl_mqar_seed0")
    assert kl.config["normalizer"] == "kl" and kl.config["normalizer.prior"] == "recency"
    assert kl.config["optim.lr"] == 0.001 and kl.config["seed"] == 0 and kl.config["head"] == "softmax_ce"
    assert not any(k.startswith(("env", "hydra", "normalizer._")) for k in kl.config)
    (mixed / "23_running").mkdir()
    (mixed / "23_running" / "run.json").write_text((mixed / "0_softmax_mqar_seed0" / "run.json").read_text())
    (mixed / "24_torn").mkdir()
    (mixed / "24_torn" / "metrics.json").write_text('{"status": "compl')
    assert {r.path.name: r.status for r in load_runs(mixed)[-2:]} == {
        "23_running": "incomplete",
        "24_torn": "unreadable",
    }
    early = {r.path.name: r for r in runs if r.status == "failed"}
    assert early["21_kl_mqar_seed2"].config["normalizer"] == "kl"  # placed from Hydra's .hydra/ record
    assert early["22_kl_mqar_seed2"].config == {}


def test_default_group_by_is_the_varying_keys_minus_seed(mixed):
    assert report.varying_keys(load_runs(mixed)) == ["normalizer", "optim.lr"]
    assert summarize(load_runs(mixed)).group_by == ["normalizer", "optim.lr"]


def test_default_group_by_without_recorded_overrides(tmp_path):
    """A key that varies on its own is kept; normalizer.prior/feature_map only follow the normalizer."""
    for i, (n, d, s) in enumerate(itertools.product(("softmax", "kl", "linear"), (16, 32), (0, 1))):
        write_run(tmp_path, f"{i}", n, 0.001, s, {"test/accuracy": 0.5}, d_model=d, overrides=False)
    assert report.varying_keys(load_runs(tmp_path)) == ["normalizer", "model.d_model"]
    rec = json.loads((tmp_path / "0" / "run.json").read_text())
    rec["config"]["trainer"]["new_option"] = 1  # a key the config gained mid-sweep is not an axis
    (tmp_path / "0" / "run.json").write_text(json.dumps(rec))
    assert report.varying_keys(load_runs(tmp_path)) == ["normalizer", "model.d_model"]
    assert any("trainer.new_option" in n for n in summarize(load_runs(tmp_path)).notes)


def test_operational_keys_and_confounded_sweep_axes(tmp_path):
    """Resume/compile-cache settings never group; axes set on the command line stay though confounded here."""
    write_run(tmp_path, "0", "softmax", 0.001, 0, {"test/accuracy": 0.5})
    resumed = write_run(tmp_path, "1", "softmax", 0.001, 1, {"test/accuracy": 0.6})
    write_run(tmp_path, "2", "kl", 0.003, 0, {"test/accuracy": 0.9}, status="interrupted")
    rec = json.loads((resumed / "run.json").read_text())
    rec["config"]["trainer"]["resume"], rec["config"]["compile_cache"] = True, "/cache"
    (resumed / "run.json").write_text(json.dumps(rec))
    assert report.varying_keys(load_runs(tmp_path)) == ["normalizer", "optim.lr"]
    table = summarize(load_runs(tmp_path))
    assert table.statuses == ["completed", "diverged", "failed", "interrupted"]
    kl = cell(table, normalizer="kl")
    assert kl.count("interrupted") == 1 and kl.stats["test/accuracy"].n == 0


def test_mean_std_counts_match_numpy_on_the_files(mixed):
    table = summarize(load_runs(mixed), metrics=["test/accuracy", "test/loss"])
    assert len(table.cells) == 4 + 1  # + the run without any config, counted under None
    for metric in ("test/accuracy", "test/loss"):
        for (n, lr), vals in on_disk(mixed, metric).items():
            s = cell(table, normalizer=n, **{"optim.lr": lr}).stats[metric]
            assert s.n == len(vals)
            assert s.mean == pytest.approx(np.mean(vals), rel=1e-12)
            assert s.std == pytest.approx(np.std(vals, ddof=1), rel=1e-12)
    div = cell(table, normalizer="softmax", **{"optim.lr": 0.003})
    fail = cell(table, normalizer="kl", **{"optim.lr": 0.003})
    assert (div.count("completed"), div.count("diverged"), div.count("failed")) == (2, 1, 0)
    assert (fail.count("completed"), fail.count("diverged"), fail.count("failed")) == (2, 0, 1)
    orphan = cell(table, normalizer=None)
    assert orphan.count("failed") == 1 and orphan.stats["test/accuracy"].n == 0
    assert any("no readable config" in n for n in table.notes)


def test_default_metrics_are_test_metrics_without_temperature_extras(tmp_path):
    table = summarize(load_runs(grid_sweep(tmp_path)))
    assert table.metrics == ["test/accuracy", "test/loss"]


def test_which_best_reads_the_best_record(tmp_path):
    for s in range(3):
        write_run(tmp_path, f"{s}", "softmax", 0.001, s, {"test/accuracy": 0.1 * s}, best={"test/accuracy": 0.5 + s})
    table = summarize(load_runs(tmp_path), metrics=["test/accuracy"], which="best")
    assert table.cells[0].stats["test/accuracy"].mean == 1.5


def runs_of(values, seeds=None, normalizer="a"):
    seeds = range(len(values)) if seeds is None else seeds
    return [
        Run(Path(f"{normalizer}{s}"), "completed", {"normalizer": normalizer, "seed": s}, {"test/accuracy": v})
        for s, v in zip(seeds, values)
    ]


def test_bootstrap_ci_contains_the_mean_and_shrinks_with_more_seeds():
    base = [0.1, 0.3, 0.5, 0.7]
    widths = []
    for reps in (2, 10):  # n = 8, 40: at least report.SMALL_N, so bootstrapped
        s = summarize(runs_of(base * reps), metrics=["test/accuracy"]).cells[0].stats["test/accuracy"]
        assert s.ci_low < s.mean < s.ci_high
        # A percentile bootstrap of the mean is about ±1.96·sd/√n wide (sd with ddof=0: resampling's sd).
        expected = 2 * 1.96 * np.std(base * reps) / math.sqrt(len(base) * reps)
        assert s.ci_high - s.ci_low == pytest.approx(expected, rel=0.12)
        widths.append(s.ci_high - s.ci_low)
    assert widths[1] < widths[0] / 2
    again = summarize(runs_of(base * 2), metrics=["test/accuracy"], seed=0).cells[0].stats["test/accuracy"]
    assert (again.ci_low, again.ci_high) == report.bootstrap_ci(base * 2, 2000, 0)  # seeded: reproducible


def test_below_small_n_a_cell_gets_the_t_interval_marked_low_n():
    values = [0.52, 0.61, 0.47, 0.58, 0.55]
    assert report.SMALL_N == 5
    for n in range(1, 6):
        s = summarize(runs_of(values[:n]), metrics=["test/accuracy"]).cells[0].stats["test/accuracy"]
        x = np.array(values[:n])
        assert s.n == n and s.low_n == (n < 5) and s.mean == pytest.approx(x.mean(), rel=1e-12)
        if n == 1:
            assert s.ci_method == "none" and math.isnan(s.ci_low) and math.isnan(s.ci_high)
        elif n < 5:
            want = np.clip(stats.t.interval(0.95, n - 1, loc=x.mean(), scale=stats.sem(x)), 0, 1)  # accuracy's range
            assert s.ci_method == "t" and (s.ci_low, s.ci_high) == pytest.approx(want, rel=1e-12)
        else:
            assert s.ci_method == "bootstrap" and (s.ci_low, s.ci_high) == report.bootstrap_ci(x, 2000, 0)


def test_fewer_than_three_pairs_give_the_differences_and_no_p_value():
    base = {0: 0.50, 1: 0.55, 2: 0.60}
    runs = runs_of(list(base.values()), list(base), "softmax")
    runs += runs_of([0.62, 0.58], [0, 1], "kl") + runs_of([0.7, 0.6, 0.9], [0, 1, 2], "linear")
    table = summarize(runs, metrics=["test/accuracy"], baseline="normalizer=softmax")
    two = cell(table, normalizer="kl").stats["test/accuracy"]
    assert two.n_pairs == 2 and two.diffs == pytest.approx({0: 0.12, 1: 0.03}, rel=1e-12)
    assert math.isnan(two.p) and math.isnan(two.t) and two.within_noise is None
    three = cell(table, normalizer="linear").stats["test/accuracy"]
    want = stats.ttest_rel([0.7, 0.6, 0.9], list(base.values()))
    assert (three.t, three.p) == pytest.approx((want.statistic, want.pvalue), rel=1e-10)
    from attnlab.report.write import to_markdown

    md = to_markdown(table)
    [kl_row] = [line for line in md.splitlines() if line.startswith("| kl |")]
    assert "+0.075 (2 pairs: +0.12, +0.03; no test)" in kl_row and "p=" not in kl_row
    assert f"p={three.p:.3g}" in md


def test_a_two_seed_sweep_report_has_no_p_value_and_no_bootstrap_interval(tmp_path, capsys):
    grid_sweep(tmp_path, norms=("softmax", "kl", "linear"), lrs=(0.001,), seeds=(0, 1))
    report_cli.main([str(tmp_path), "--baseline", "normalizer=softmax", "--curves"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "normalizer" not in line]
    assert len(rows) == 3 and all("low n" in r for r in rows) and "p=" not in out
    assert "(here 2 to 2 per cell)" in out
    with open(tmp_path / "report" / "report.csv") as f:
        got = list(csv.DictReader(f))
    assert {r["ci_method"] for r in got} == {"t"} and {r["low_n"] for r in got} == {"True"}
    for norm, vals in ((k[0], v) for k, v in on_disk(tmp_path, "test/accuracy").items()):
        [row] = [r for r in got if r["normalizer"] == norm and r["metric"] == "test/accuracy"]
        want = np.clip(stats.t.interval(0.95, 1, loc=np.mean(vals), scale=stats.sem(vals)), 0, 1)
        assert (float(row["ci_low"]), float(row["ci_high"])) == pytest.approx(want, rel=1e-12)
        assert row["p"] == "nan"


def test_paired_bootstrap_interval_uses_the_requested_n_boot_and_seed():
    rng = np.random.default_rng(1)
    base = 0.5 + 0.05 * rng.standard_normal(8)  # 8 pairs: at least SMALL_N, so the Δ interval is bootstrapped
    other = base + 0.02 + 0.03 * rng.standard_normal(8)
    runs = runs_of(list(base), None, "softmax") + runs_of(list(other), None, "kl")
    d = other - base
    got = {}
    for seed in (3, 4):
        table = summarize(runs, metrics=["test/accuracy"], baseline="normalizer=softmax", n_boot=500, seed=seed)
        got[seed] = cell(table, normalizer="kl").stats["test/accuracy"].diff_ci
        assert got[seed] == report.bootstrap_ci(d, 500, seed)  # Δ within ±1: nothing clipped
    assert got[3] != got[4]


def test_paired_p_value_is_ttest_rel_on_matched_seeds():
    rng = np.random.default_rng(0)
    base = dict(zip(range(5), 0.5 + 0.05 * rng.standard_normal(5)))
    kl = {s: base.get(s, 0.5) + 0.01 + 0.05 * rng.standard_normal() for s in (0, 1, 2, 3, 5)}  # seed 4 absent, 5 extra
    lin = {s: base[s] + 0.2 + 0.001 * rng.standard_normal() for s in range(5)}  # a large, consistent effect
    mid = {s: base[s] + d for s, d in zip(range(3), (0.1, 0.2, 0.3))}  # |mean Δ| = 2·std Δ, yet p ≈ 0.07
    same = dict(base)  # identical to the baseline on every seed
    runs = (
        runs_of(list(base.values()), list(base), "softmax")
        + runs_of(list(kl.values()), list(kl), "kl")
        + runs_of(list(lin.values()), list(lin), "linear")
        + runs_of(list(mid.values()), list(mid), "relu")
        + runs_of(list(same.values()), list(same), "entmax")
    )
    table = summarize(runs, metrics=["test/accuracy"], baseline="normalizer=softmax")
    s = cell(table, normalizer="kl").stats["test/accuracy"]
    matched = [0, 1, 2, 3]
    x, y = np.array([kl[i] for i in matched]), np.array([base[i] for i in matched])
    assert s.n_pairs == 4
    assert s.p == pytest.approx(stats.ttest_rel(x, y).pvalue, rel=1e-10)
    assert s.diff_mean == pytest.approx(np.mean(x - y), rel=1e-12)
    assert s.within_noise == (abs(np.mean(x - y)) <= np.std(x - y, ddof=1))
    big = cell(table, normalizer="linear").stats["test/accuracy"]
    assert big.within_noise is False and big.p < 1e-6
    mid_s = cell(table, normalizer="relu").stats["test/accuracy"]
    assert mid_s.within_noise is False and mid_s.p > 0.05  # the effect-size rule, not the p-value rule
    tie = cell(table, normalizer="entmax").stats["test/accuracy"]
    assert (tie.p, tie.diff_mean, tie.within_noise) == (1.0, 0.0, True)  # not ttest_rel's nan
    assert cell(table, normalizer="softmax").is_baseline
    with pytest.raises(ValueError, match="group keys"):
        summarize(runs, metrics=["test/accuracy"], baseline="optim.lr=0.1")


def test_select_lr_picks_the_best_validation_lr_per_group(tmp_path):
    """val/loss is lowest at softmax 1e-3 and kl 1e-2; test accuracy, best elsewhere, must not steer the choice."""
    val = {
        ("softmax", 0.001): 1.0,
        ("softmax", 0.01): 1.5,
        ("softmax", 0.03): 1.2,
        ("kl", 0.001): 1.4,
        ("kl", 0.01): 1.1,
        ("kl", 0.03): 0.9,
    }  # kl@0.03 has a diverged seed
    i = 0
    for (n, lr), v in val.items():
        for s in range(3):
            status = "diverged" if (n, lr, s) == ("kl", 0.03, 2) else "completed"
            final = {"val/loss": v + 0.01 * s, "test/accuracy": v + 0.1 * s * (lr == 0.001)}
            write_run(tmp_path, f"{i}", n, lr, s, final, status=status)
            i += 1
    table = summarize(load_runs(tmp_path), metrics=["test/accuracy"], select_lr=True)
    assert table.group_by == ["normalizer"]
    assert cell(table, normalizer="softmax").lr == 0.001
    assert cell(table, normalizer="kl").lr == 0.01  # 0.03 is better on val but had a diverged run
    chosen = on_disk(tmp_path, "test/accuracy")
    for n, lr in (("softmax", 0.001), ("kl", 0.01)):
        s = cell(table, normalizer=n).stats["test/accuracy"]
        assert s.mean == pytest.approx(np.mean(chosen[(n, lr)])) and s.n == 3
    with pytest.raises(ValueError, match="single learning rate"):
        summarize(load_runs(grid_sweep(tmp_path / "one", lrs=(0.001,))), select_lr=True)


def test_missing_and_short_cells_of_a_partial_sweep(tmp_path, capsys):
    grid_sweep(tmp_path, skip={("kl", 0.003, s) for s in range(3)} | {("softmax", 0.001, 2)})
    table = summarize(load_runs(tmp_path))
    assert table.missing == [{"normalizer": "kl", "optim.lr": 0.003}]
    assert table.short == [({"normalizer": "softmax", "optim.lr": 0.001}, 2, [2])]
    report_cli.main([str(tmp_path), "--curves"])
    out = capsys.readouterr().out
    assert "Missing cell (no run): normalizer=kl, optim.lr=0.003" in out
    assert "normalizer=softmax, optim.lr=0.001 has 2 completed of 3 (missing seed 2)" in out
    complete = summarize(load_runs(grid_sweep(tmp_path / "full")))
    assert complete.missing == [] and complete.short == [] and complete.completeness()[0].startswith("Complete")


def test_csv_round_trips_and_latex_uses_booktabs(tmp_path):
    grid_sweep(tmp_path / "s")
    table = summarize(load_runs(tmp_path / "s"), baseline="normalizer=softmax")
    write_report(table, tmp_path / "out", curves=())
    with open(tmp_path / "out" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(table.rows()) == 4 * 2
    for got, want in zip(rows, table.rows()):
        assert (got["normalizer"], float(got["optim.lr"]), got["metric"]) == (
            want["normalizer"],
            want["optim.lr"],
            want["metric"],
        )
        assert int(got["n"]) == want["n"] and int(got["completed"]) == want["completed"]
        for k in ("mean", "std", "ci_low", "ci_high", "diff_mean", "p"):
            assert float(got[k]) == want[k] or (math.isnan(float(got[k])) and math.isnan(want[k]))
    tex = to_latex(table)
    assert all(rule in tex for rule in (r"\toprule", r"\midrule", r"\bottomrule"))
    assert r"$\pm$" in tex and r"$\Delta$" in tex and tex.count(r"\\") == 1 + len(table.cells)


def write_events(run_dir: Path, curves: dict[str, list[float]]):
    from tensorboardX import SummaryWriter

    with SummaryWriter(str(run_dir)) as w:
        for tag, values in curves.items():
            for step, v in enumerate(values, start=1):
                w.add_scalar(tag, v, step * 2)


def test_learning_curves_have_seed_bands_and_valid_pngs(tmp_path):
    import matplotlib.image

    grid_sweep(tmp_path, lrs=(0.001,))
    written = {}
    for r in load_runs(tmp_path):
        vals = [3.0 - 0.1 * k + 0.01 * r.seed + (r.config["normalizer"] == "kl") for k in range(4)]
        write_events(r.path, {"val/loss": vals, "train/loss": vals[::-1]})
        written.setdefault(r.config["normalizer"], []).append(vals)
    table = summarize(load_runs(tmp_path))
    steps, mean, std, n = curve(cell(table, normalizer="kl").runs, "val/loss")
    assert list(steps) == [2, 4, 6, 8] and list(n) == [3] * 4
    np.testing.assert_allclose(mean, np.mean(written["kl"], axis=0), rtol=1e-6)
    np.testing.assert_allclose(std, np.std(written["kl"], axis=0, ddof=1), rtol=1e-4)
    files = write_report(table, tmp_path / "report", curves=["val/loss", "train/loss", "no/such_tag"])
    pngs = [f for f in files if f.suffix == ".png"]
    assert [p.name for p in pngs] == ["curve_val_loss.png", "curve_train_loss.png"]
    for p in pngs:
        assert p.read_bytes()[:8] == PNG_MAGIC
        img = matplotlib.image.imread(p)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "![curve_val_loss](curve_val_loss.png)" in md and "no/such_tag" in md


@pytest.mark.parametrize("lrs", [(0.001,), (0.001, 0.002, 0.003, 0.004, 0.005)])
def test_curve_legend_never_covers_the_curves(tmp_path, lrs):
    from attnlab.report.plots import LEGEND_INSIDE_MAX, draw_curves

    grid_sweep(tmp_path, lrs=lrs, seeds=(0,))
    for r in load_runs(tmp_path):
        write_events(r.path, {"val/loss": [2.0, 1.0 + r.config["optim.lr"] * 100, 0.5]})
    table = summarize(load_runs(tmp_path), group_by=["normalizer", "optim.lr"])
    fig = draw_curves(table, "val/loss")
    fig.canvas.draw()
    [ax] = fig.axes
    legend, axes_box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert len(ax.get_legend().get_texts()) == len(table.cells) == 2 * len(lrs)
    if len(table.cells) > LEGEND_INSIDE_MAX:  # beside the axes, and inside the figure
        assert legend.x0 >= axes_box.x1 and legend.x1 <= fig.bbox.x1 and legend.y0 >= fig.bbox.y0
    else:
        assert axes_box.x0 <= legend.x0 and legend.x1 <= axes_box.x1


def test_log_y_patterns_pick_the_log_scaled_curves(tmp_path, monkeypatch):
    from attnlab.report import plots as report_write

    grid_sweep(tmp_path, lrs=(0.001,))
    for r in load_runs(tmp_path):
        write_events(r.path, {"grad_norm/layer_0": [10.0**-k for k in range(4)], "val/loss": [1.0, 0.5, 0.2, 0.1]})
    table = summarize(load_runs(tmp_path))
    fig = report_write.draw_curves(table, "grad_norm/layer_0", log_y=True)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [1.0, 0.1, 0.01, 0.001], rtol=1e-6)  # seeds agree
    assert report_write.draw_curves(table, "val/loss").axes[0].get_yscale() == "linear"
    seen = {}
    real = report_write.plot_curves

    def recording(t, tag, path, cache=None, log_y=False):
        seen[tag] = log_y
        return real(t, tag, path, cache, log_y)

    monkeypatch.setattr(report_write, "plot_curves", recording)
    report_cli.main([str(tmp_path), "--curves", "grad_norm/layer_0", "val/loss", "--log-y", "grad_norm/*"])
    assert seen == {"grad_norm/layer_0": True, "val/loss": False}
    assert (tmp_path / "report" / "curve_grad_norm_layer_0.png").read_bytes()[:8] == PNG_MAGIC


def test_cli_exits_2_on_a_missing_or_empty_dir(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        report_cli.main([str(tmp_path / "nope")])
    assert exc.value.code == 2 and "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        report_cli.main([str(tmp_path)])
    assert exc.value.code == 2 and "no runs" in capsys.readouterr().err
    grid_sweep(tmp_path / "s")
    with pytest.raises(SystemExit) as exc:
        report_cli.main([str(tmp_path / "s"), "--baseline", "model=base"])
    assert exc.value.code == 2 and "baseline" in capsys.readouterr().err


def test_cli_writes_the_report(tmp_path, capsys):
    grid_sweep(tmp_path)
    report_cli.main(
        [
            str(tmp_path),
            "--metrics",
            "test/accuracy",
            "--baseline",
            "normalizer=softmax",
            "--curves",
            "--out",
            str(tmp_path / "rep"),
        ]
    )
    out = capsys.readouterr().out
    assert "| normalizer | optim.lr | n | diverged | failed | test/accuracy |" in out
    assert {p.name for p in (tmp_path / "rep").iterdir()} == {"report.md", "report.tex", "report.csv"}


@pytest.mark.slow
def test_report_of_a_real_tiny_sweep(tmp_path):
    """Two normalizers × two seeds through the real trainer (~2 min on 2 cores), then attnlab-report."""
    from cli_helpers import TINY, tiny_task, train_in_process

    sweep = tmp_path / "sweep"
    train_in_process(
        "-m",
        "normalizer=softmax,linear",
        "seed=0,1",
        *TINY,
        *tiny_task("mqar"),
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    runs = load_runs(sweep)
    assert len(runs) == 4 and {r.status for r in runs} == {"completed"}
    table = summarize(runs, baseline="normalizer=softmax")
    assert table.group_by == ["normalizer"] and "test/accuracy" in table.metrics
    by_norm: dict[str, list[float]] = {}
    for p in sweep.iterdir():
        if (p / "metrics.json").exists():
            norm = json.loads((p / "run.json").read_text())["choices"]["normalizer"]
            by_norm.setdefault(norm, []).append(json.loads((p / "metrics.json").read_text())["final"]["test/accuracy"])
    for norm, vals in by_norm.items():
        s = cell(table, normalizer=norm).stats["test/accuracy"]
        assert s.n == 2 and s.mean == pytest.approx(np.mean(vals)) and s.std == pytest.approx(np.std(vals, ddof=1))
        assert s.low_n and s.ci_method == "t" and math.isnan(s.p)  # two seeds: no bootstrap, no p-value
        want = np.clip(stats.t.interval(0.95, 1, loc=np.mean(vals), scale=stats.sem(vals)), 0, 1)
        assert (s.ci_low, s.ci_high) == pytest.approx(want, rel=1e-9)
    report_cli.main([str(sweep)])
    assert (sweep / "report" / "curve_val_loss.png").read_bytes()[:8] == PNG_MAGIC
    assert (sweep / "report" / "report.csv").exists()


@pytest.mark.parametrize(
    "args, named",
    [
        (
            ["--baseline", "normalizer=sofmax"],
            "baseline 'normalizer=sofmax' matches no cell; normalizer values: kl, softmax",
        ),
        (["--group-by", "normaliser"], "unknown group key(s) normaliser; varying keys: normalizer, optim.lr"),
        (["--metrics", "test/acc"], "metric 'test/acc' matches nothing; available: test/accuracy, test/accuracy_ts,"),
        (["--select-lr", "--select-by", "val/los"], "select_by metric val/los in no completed run's final record"),
        (
            ["--curves", "val/*", "grad_norm/*"],
            "curve pattern 'grad_norm/*' matches nothing; available: train/loss, val/loss",
        ),
        (["--curves", "val/*", "--log-y", "train/*"], "--log-y pattern 'train/*' matches nothing; available: val/loss"),
        (["--columns", "0"], "--columns 0; allowed: an integer >= 1"),
    ],
)
def test_a_pattern_that_matches_nothing_exits_2_naming_what_exists(tmp_path, capsys, args, named):
    grid_sweep(tmp_path, seeds=(0, 1))
    for r in load_runs(tmp_path):
        write_events(r.path, {"val/loss": [1.0, 0.5], "train/loss": [2.0, 1.0]})
    with pytest.raises(SystemExit) as exc:
        report_cli.main([str(tmp_path), *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and named in err, err
    assert not (tmp_path / "report").exists()


def test_metrics_and_curves_accept_glob_patterns(tmp_path):
    grid_sweep(tmp_path, lrs=(0.001,), seeds=(0, 1))
    for r in load_runs(tmp_path):
        write_events(r.path, {"val/loss": [1.0, 0.5], "val/accuracy": [0.1, 0.2], "train/loss": [2.0, 1.0]})
    table = summarize(load_runs(tmp_path), metrics=["test/acc*", "test/accuracy", "val/loss"])
    assert table.metrics == ["test/accuracy", "test/accuracy_ts", "val/loss"]  # each once, in pattern order
    report_cli.main([str(tmp_path), "--curves", "val/*", "--log-y", "val/l*"])
    assert sorted(p.name for p in (tmp_path / "report").glob("*.png")) == [
        "curve_val_accuracy.png",
        "curve_val_loss.png",
    ]


def test_a_wide_table_is_split_per_metric_group_and_each_part_states_n(tmp_path):
    from attnlab.report.tables import display
    from attnlab.report.write import to_markdown

    def value(n, lr, s):
        return 0.5 + 0.1 * (n == "kl") + 0.01 * s * (1 + s + (n == "kl"))

    grid_sweep(tmp_path, lrs=(0.001,), value=value)
    metrics = ["test/accuracy", "test/loss", "test/accuracy_ts", "test/temperature", "val/loss"]
    table = summarize(load_runs(tmp_path), metrics=metrics, baseline="normalizer=softmax")
    # fixed columns: normalizer, n, diverged, failed; each metric adds its value and its Δ
    full_header, full_rows = display(table)
    assert len(full_header) == 4 + 2 * 5
    md = to_markdown(table, max_columns=8)
    tables = [[line for line in block.splitlines() if line.startswith("|")] for block in md.split("\n\n")]
    tables = [t for t in tables if t]
    heads = [[h.strip() for h in t[0].strip("|").split("|")] for t in tables]
    assert [h[4:] for h in heads] == [
        ["test/accuracy", "test/loss", "Δ test/accuracy vs normalizer=softmax", "Δ test/loss vs normalizer=softmax"],
        [
            "test/accuracy_ts",
            "test/temperature",
            "Δ test/accuracy_ts vs normalizer=softmax",
            "Δ test/temperature vs normalizer=softmax",
        ],
        ["val/loss", "Δ val/loss vs normalizer=softmax"],
    ]
    assert all(h[:4] == ["normalizer", "n", "diverged", "failed"] and len(h) <= 8 for h in heads)
    assert "Table 1 of 3: test/accuracy, test/loss" in md
    for t, h in zip(tables, heads):  # every part holds the same cells as the full table, n included
        for line, full in zip(t[2:], full_rows):
            got = dict(zip(h, (c.strip() for c in line.strip("|").split("|"))))
            assert got == {k: v for k, v in zip(full_header, full) if k in got}
    tex = to_latex(table, max_columns=8)
    assert tex.count(r"\begin{tabular}{lrrrrrrr}") == 2 and tex.count(r"\begin{tabular}{lrrrrr}") == 1
    assert [line.startswith("|---") for line in to_markdown(table, max_columns=14).splitlines()].count(True) == 1


def test_log_y_bands_are_the_geometric_mean_and_spread(tmp_path):
    from attnlab.report import plots

    grid_sweep(tmp_path, norms=("softmax",), lrs=(0.001,), seeds=(0, 1, 2))
    logged = {0: [1.0, 1e-2, 1e-4], 1: [10.0, 1e-1, 1e-3], 2: [100.0, 1.0, 0.0]}  # a 0 at the last step
    for r in load_runs(tmp_path):
        write_events(r.path, {"grad_norm/layer_0": logged[r.seed]})
    fig = plots.draw_curves(summarize(load_runs(tmp_path)), "grad_norm/layer_0", log_y=True)
    ax = fig.axes[0]
    logs = [np.log([logged[s][k] for s in range(3) if logged[s][k] > 0]) for k in range(3)]
    gmean = np.exp([v.mean() for v in logs])
    gstd = np.exp([v.std(ddof=1) for v in logs])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), gmean, rtol=1e-6)  # 10, 0.1, sqrt(1e-4·1e-3)
    band_y = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band_y.min() > 0
    want = np.concatenate([gmean / gstd, gmean * gstd])
    assert all(np.isclose(band_y, w, rtol=1e-5).any() for w in want)  # the band's edges, and nothing else
    assert all(np.isclose(want, y, rtol=1e-5).any() for y in band_y)
    assert "1 value(s) <= 0 left out" in ax.get_title()


def test_under_select_lr_a_cell_rates_of_its_own_are_not_missing_cells(tmp_path):
    """A grid extended for one cell, or the selected rate's runs alone, gives cells different rates: the expected
    cells are the group keys' product, not that times every rate seen."""
    grid_sweep(tmp_path, skip={("kl", 0.003, s) for s in range(3)})
    table = summarize(load_runs(tmp_path), select_lr=True)
    assert table.group_by == ["normalizer"] and table.missing == [] and table.short == []
    assert table.completeness()[0].startswith("Complete")
    grid_sweep(tmp_path / "short", skip={("kl", lr, 2) for lr in (0.001, 0.003, 0.01)})
    short = summarize(load_runs(tmp_path / "short"), select_lr=True)
    assert short.completeness() == ["Fewer seeds: normalizer=kl has 2 completed of 3 (missing seed 2)"]


def test_report_md_folds_its_prose_at_the_terminal_width_and_keeps_tables_and_headings_whole():
    from attnlab.report import write

    item = "- **test/loss**: " + " ".join(f"word{i}" for i in range(60))
    numbered = "  2. " + "x" * 30 + " " + " ".join(["Δ +0.1 [−0.2, +0.3]"] * 12)
    table = "| " + " | ".join(["cell"] * 40) + " |"
    lines = ["# " + "title " * 40, item, numbered, table, "plain " * 30]
    out = write.folded(lines)
    assert out[0] == lines[0] and table in out  # a heading and a table row stay one line each
    assert all(len(line) <= write.WIDTH for line in out if line not in (lines[0], table))
    unfolded = " ".join(" ".join(out).split())
    assert unfolded == " ".join(" ".join(lines).split())  # nothing lost, nothing added
    start = next(i for i, x in enumerate(out) if x.startswith("- **"))
    assert out[start + 1].startswith("  word")  # a list item's continuation under its text
    second = next(i for i, x in enumerate(out) if x.startswith("  2. "))
    assert out[second + 1].startswith("     ") and not out[second + 1].startswith("      ")
