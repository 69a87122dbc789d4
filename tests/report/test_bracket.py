"""Learning-rate grids that bracket: `--select-lr` says which cell selected the edge of its grid (report.md, and
report.csv's lr_at_edge and lr_grid), experiments/bracket_lrs.py prints the rate beyond each edge, and
experiments/study.sh's bracket_screen extends a screen until it brackets or its limit is reached."""

from __future__ import annotations

import csv
import importlib.util
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from run_records import write_run

from attnlab.report import cli as report_cli
from attnlab.report import load_runs, records, summarize

ROOT = Path(__file__).resolve().parents[2]
LRS = (1e-3, 3e-3, 1e-2)
OPTIMUM = {"softmax": 3e-3, "sigmoid": 0.05, "linear": 1e-5}  # interior, above the grid, below it


def val_loss(norm, lr):
    return 1.0 + (math.log10(lr) - math.log10(OPTIMUM[norm])) ** 2


def screen(root, lrs=LRS, norms=("softmax", "sigmoid", "linear")):
    for i, (norm, lr) in enumerate((n, lr) for n in norms for lr in lrs):
        final = {"val/loss": val_loss(norm, lr), "test/accuracy": 0.5, "test/loss": val_loss(norm, lr)}
        write_run(root, f"{i}_normalizer={norm},optim.lr={lr}", norm, lr, 0, final)
    return root


def bracket_lrs():
    spec = importlib.util.spec_from_file_location("bracket_lrs", ROOT / "experiments" / "bracket_lrs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_selected_rate_at_the_edge_of_its_grid_is_stated(tmp_path, capsys):
    screen(tmp_path)
    table = summarize(load_runs(tmp_path), group_by=["normalizer"], select_lr=True)
    assert {c.key["normalizer"]: (c.lr, c.lr_edge) for c in table.cells} == {
        "linear": (1e-3, "low"),
        "sigmoid": (1e-2, "high"),
        "softmax": (3e-3, ""),
    }
    assert report_cli.cli([str(tmp_path), "--select-lr", "--group-by", "normalizer", "--curves"]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert (
        "**Learning rates not bracketed** in 2 of 3 cells (normalizer=linear: optim.lr=0.001, at the low edge of "
        "its grid (lowest of 0.001 to 0.01): not bracketed, a lower rate may be better (experiments/bracket_lrs.py "
        "extends the grid); normalizer=sigmoid: optim.lr=0.01, at the high edge of its grid (highest of 0.001 to "
        "0.01): not bracketed, a higher rate may be better (experiments/bracket_lrs.py extends the grid)). Each is "
        "compared at the edge of the rates it was given, which may not be its best."
    ) in md
    [softmax] = [line for line in md.splitlines() if line.startswith("- normalizer=softmax: optim.lr=")]
    assert "edge" not in softmax
    with open(tmp_path / "report" / "report.csv", newline="") as f:
        rows = {r["normalizer"]: r for r in csv.DictReader(f)}
    assert {n: r["lr_at_edge"] for n, r in rows.items()} == {"linear": "low", "sigmoid": "high", "softmax": ""}
    assert rows["softmax"]["lr_grid"] == "0.001 0.003 0.01"
    assert list(rows["softmax"])[:4] == ["normalizer", "optim.lr", "lr_at_edge", "lr_grid"]


def test_cells_of_one_rate_each_are_not_called_unbracketed(tmp_path):
    """A study's final report over the runs its screens selected: one rate per cell is said as such, not as a grid
    that failed to bracket."""
    screen(tmp_path, lrs=(3e-3,), norms=("softmax",))
    screen(tmp_path / "b", lrs=(0.05,), norms=("sigmoid",))
    assert report_cli.cli([str(tmp_path), "--select-lr", "--group-by", "normalizer", "--curves"]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "not bracketed" not in md
    assert (
        "**One rate per cell, selected before this report** in 2 of 2 cells (normalizer=sigmoid: optim.lr=0.05; "
        "normalizer=softmax: optim.lr=0.003): their runs share one rate"
    ) in md


def test_a_rate_above_the_selected_one_that_diverged_brackets_it(tmp_path):
    """sigmoid's optimum (0.05) lies above 1e-2; a run at 3e-2 that diverged bounds the grid all the same."""
    screen(tmp_path / "a", norms=("sigmoid",))
    [cell] = summarize(load_runs(tmp_path / "a"), group_by=["normalizer"], select_lr=True).cells
    assert (cell.lr, cell.lr_edge) == (1e-2, "high")
    write_run(tmp_path / "a", "9_diverged", "sigmoid", 3e-2, 0, {"val/loss": 99.0}, status="diverged")
    [cell] = summarize(load_runs(tmp_path / "a"), group_by=["normalizer"], select_lr=True).cells
    assert (cell.lr, cell.lr_grid, cell.lr_edge) == (1e-2, [1e-3, 3e-3, 1e-2, 3e-2], "")


def test_bracket_lrs_prints_one_rate_beyond_each_edge_on_the_grids_own_ratio(tmp_path, capsys):
    screen(tmp_path)
    report_cli.cli([str(tmp_path), "--select-lr", "--group-by", "normalizer", "--curves"])
    capsys.readouterr()
    module = bracket_lrs()
    module.main([str(tmp_path / "report" / "report.csv"), "normalizer"])
    # ×/÷ 10^0.5 = 3.16: the grid 1e-3, 3e-3, 1e-2 spans a decade in two steps
    assert capsys.readouterr().out == "normalizer=linear optim.lr=0.000316\nnormalizer=sigmoid optim.lr=0.0316\n"
    module.main([str(tmp_path / "report" / "report.csv"), "normalizer", "--edges"])
    assert capsys.readouterr().out == (
        "normalizer=linear: optim.lr=0.001, the low edge of 0.001, 0.003, 0.01\n"
        "normalizer=sigmoid: optim.lr=0.01, the high edge of 0.001, 0.003, 0.01\n"
    )
    assert module.rate(module.beyond(0.0316, module.step([1e-3, 3e-3, 1e-2, 0.0316]), +1)) == "0.1"  # on the lattice
    assert module.rate(module.beyond(4e-3, module.step([1e-3, 2e-3, 4e-3]), +1)) == "0.008"  # ×2 grid
    assert module.rate(module.beyond(3e-4, module.step([3e-4, 1e-3, 3e-3]), -1, [3e-4, 1e-3, 3e-3])) == "0.0001"
    assert module.rate(module.beyond(3e-2, module.step([3e-3, 3e-2]), +1, [3e-3, 3e-2])) == "0.3"  # off the decades
    rows = [{"normalizer": "relu", "lr_at_edge": "only", "lr_grid": "0.003"}, {"lr_at_edge": "", "lr_grid": "0.1 1"}]
    assert [module.rate(lr) for _, lr in module.extensions(rows)] == ["0.0003", "0.03"]  # ÷ and × 10


def test_bracket_lrs_refuses_a_csv_without_the_columns(tmp_path):
    (tmp_path / "report.csv").write_text("normalizer,optim.lr,metric\nsoftmax,0.001,val/loss\n")
    with pytest.raises(SystemExit) as exc:
        bracket_lrs().main([str(tmp_path / "report.csv"), "normalizer"])
    assert "has no 'lr_at_edge', 'lr_grid' column(s)" in str(exc.value)


STUB = """\
#!{python}
# attnlab-train -m as the test needs it: writes one completed run per combination of the comma lists, its val loss
# a parabola in log10(lr) around the normalizer's optimum
import itertools, math, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from run_records import write_run
OPTIMUM = {optimum!r}
args = dict(a.split("=", 1) for a in sys.argv[1:] if a != "-m")
out = Path(args.pop("hydra.sweep.dir"))
norms, lrs = args["normalizer"].split(","), args["optim.lr"].split(",")
for i, (norm, lr) in enumerate(itertools.product(norms, map(float, lrs))):
    loss = 1.0 + (math.log10(lr) - math.log10(OPTIMUM[norm])) ** 2
    write_run(out, f"{{i}}_normalizer={{norm}},optim.lr={{lr}}", norm, lr, 0, {{"val/loss": loss, "test/loss": loss}})
with open(out.parent / "calls.txt" if out.name.isdigit() else out / "calls.txt", "a") as f:
    f.write(" ".join(a for a in sys.argv[1:] if a != "-m" and not a.startswith("hydra.")) + "\\n")
"""


def test_bracket_screen_extends_the_grid_until_it_brackets_or_its_limit(tmp_path):
    """experiments/study.sh's function on a stub trainer and the real attnlab-report: sigmoid (optimum 0.05) brackets
    after two extensions (0.0316, then 0.1), linear (optimum 1e-5) never does within 2; run again, it trains nothing.
    A round's two extensions run side by side (STUDY_JOBS=2)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    stub = bin_ / "attnlab-train"
    stub.write_text(STUB.format(python=sys.executable, tests=str(ROOT / "tests"), optimum=OPTIMUM))
    stub.chmod(0o755)
    for name in ("attnlab-report", "python"):
        (bin_ / name).symlink_to(shutil.which(name, path=str(Path(sys.executable).parent)))
    sweep = tmp_path / "screen"
    script = (
        f'STUDY=t; source "{ROOT}/experiments/study.sh"; set -euo pipefail; '
        f'bracket_screen "{sweep}" normalizer 2 --metrics val/loss -- normalizer=softmax,sigmoid,linear '
        "optim.lr=1e-3,3e-3,1e-2 seed=0"
    )
    env = {**os.environ, "BIN": str(bin_), "JAX_PLATFORMS": "cpu", "STUDY_JOBS": "2"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("bracket_screen:")]
    assert said == [
        "bracket_screen: round 1 of 2: normalizer=linear optim.lr=0.000316",
        "bracket_screen: round 1 of 2: normalizer=sigmoid optim.lr=0.0316",
        "bracket_screen: round 2 of 2: normalizer=linear optim.lr=0.0001",
        "bracket_screen: round 2 of 2: normalizer=sigmoid optim.lr=0.1",
        "bracket_screen: never bracketed after 2 extension(s): normalizer=linear: optim.lr=0.0001, the low edge of "
        "0.0001, 0.000316, 0.001, 0.003, 0.01",
    ], done.stderr
    calls = sorted((sweep / "extend1" / "calls.txt").read_text().splitlines())  # side by side: in either order
    assert calls == ["seed=0 normalizer=linear optim.lr=0.000316", "seed=0 normalizer=sigmoid optim.lr=0.0316"]
    with open(sweep / "report" / "report.csv", newline="") as f:
        rows = {r["normalizer"]: r for r in csv.DictReader(f)}
    assert {n: (float(r["optim.lr"]), r["lr_at_edge"]) for n, r in rows.items()} == {
        "linear": (1e-4, "low"),
        "sigmoid": (0.0316, ""),
        "softmax": (3e-3, ""),
    }
    packed = records.read(sweep / "report" / "report.records.json.xz")["files"]  # the report outlives its runs
    assert {name for name in packed if name.endswith("metrics.json")} == {
        path.relative_to(sweep).as_posix() for path in sweep.rglob("metrics.json")
    }
    again = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr  # resumed: every sweep finished, none trained again
    assert again.stderr.count("finished earlier, kept") == 5, again.stderr  # the grid and 4 extensions
    assert sorted((sweep / "extend1" / "calls.txt").read_text().splitlines()) == calls
    assert len((sweep / "grid" / "calls.txt").read_text().splitlines()) == 1
    other = subprocess.run(
        ["bash", "-c", script.replace("1e-3,3e-3", "3e-4,1e-3,3e-3")], env=env, capture_output=True, text=True
    )
    assert other.returncode == 2 and "grid was finished by another command" in other.stderr, other.stderr
    usage = subprocess.run(
        ["bash", "-c", f'STUDY=t; source "{ROOT}/experiments/study.sh"; bracket_screen "{sweep}" normalizer x -- a'],
        env=env,
        capture_output=True,
        text=True,
    )
    assert usage.returncode == 2 and usage.stderr.startswith("bracket_screen: usage: bracket_screen SWEEP_DIR")
