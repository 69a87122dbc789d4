"""A sweep packed into one records file (`attnlab-report DIR --records FILE`) reports as the sweep itself."""

from __future__ import annotations

import json
import lzma
import math
from pathlib import Path

import numpy as np
import pytest
from run_records import write_run
from tensorboardX import SummaryWriter
from test_expected import sweep_yaml
from test_report import grid_sweep

from attnlab import exits
from attnlab.report import cli as report_cli
from attnlab.report import records
from attnlab.report.load import scalars

ACCURACY = {"softmax": 0.8, "kl": 0.75, "linear": 0.3}
NORMALIZERS = tuple(ACCURACY)
OPTIONS = ["--baseline", "normalizer=softmax", "--curves", "val/loss", "attn_*", "--formed", "test/accuracy>=0.5"]


def logged_sweep(root):
    """normalizer × seed 0-2 with TensorBoard curves; linear seed 2 failed before its run.json (a Hydra record),
    kl seed 2 never started, and one run ran on another jax."""
    root.mkdir()
    sweep_yaml(root, [f"normalizer={','.join(NORMALIZERS)}", "seed=0,1,2"])
    rng = np.random.default_rng(3)
    for i, (norm, seed) in enumerate((n, s) for n in NORMALIZERS for s in range(3)):
        name = f"{i}_normalizer={norm},seed={seed}"
        if (norm, seed) == ("kl", 2):
            continue
        if (norm, seed) == ("linear", 2):
            write_run(root, name, norm, 0.001, seed, None, status="failed", record="hydra")
            continue
        acc = ACCURACY[norm] + 0.03 * rng.standard_normal()
        final = {"val/loss": 2 - acc, "test/accuracy": acc, "test/loss": 2 - acc}
        env = {"versions": {"jax": "0.4.1" if i == 1 else "0.4.2"}}
        path = write_run(root, name, norm, 0.001, seed, final, env=env)
        with SummaryWriter(logdir=str(path)) as writer:
            for step in range(1, 21):
                writer.add_scalar("val/loss", 2 - acc * step / 20 + 0.01 * rng.standard_normal(), step * 10)
                writer.add_scalar("attn_entropy/layer_0", math.log(16) / step, step * 10)
    return root


def report_files(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture
def packed(tmp_path):
    """(the sweep, its records file, the report written from the sweep as the records were packed)."""
    sweep = logged_sweep(tmp_path / "sweep")
    file = tmp_path / f"study{records.SUFFIX}"
    argv = [str(sweep), *OPTIONS, "--records", str(file), "--out", str(tmp_path / "from_dirs")]
    assert report_cli.cli(argv) == 0
    return sweep, file, report_files(tmp_path / "from_dirs")


def test_the_records_file_reports_as_the_sweep_byte_for_byte(packed, tmp_path):
    sweep, file, from_dirs = packed
    assert records.command(file) == OPTIONS
    assert report_cli.cli([str(file), *records.command(file), "--out", str(tmp_path / "from_records")]) == 0
    from_records = report_files(tmp_path / "from_records")
    assert set(from_records) == {"report.md", "report.tex", "report.csv", "curve_val_loss.png"} | {
        "curve_attn_entropy_layer_0.png"
    }
    assert from_records == from_dirs  # tables, verdict, provenance, progress and the curves' pixels
    md = from_dirs["report.md"].decode()
    assert "7 of 9 runs completed (1 failed); missing: 5_normalizer=kl,seed=2 (not started)." in md
    assert "- jax: 0.4.2 in 6 of 7 runs; differs in normalizer=softmax (0.4.1: 1_normalizer=softmax,seed=1)" in md


def test_the_records_file_is_smaller_than_the_sweep_and_packs_to_the_same_bytes(packed, tmp_path):
    sweep, file, _ = packed
    on_disk = sum(p.stat().st_size for p in sweep.rglob("*") if p.is_file() and "report" not in p.parts)
    assert file.stat().st_size < on_disk / 2
    again = records.pack(sweep, tmp_path / f"again{records.SUFFIX}", OPTIONS)
    assert again.read_bytes() == file.read_bytes()


def test_scalars_come_back_exactly_as_the_event_files_hold_them(packed, tmp_path):
    sweep, file, _ = packed
    root = records.unpack(file, tmp_path / "unpacked")
    run = "0_normalizer=softmax,seed=0"
    assert scalars(root / run) == scalars(sweep / run)
    assert not list((root / run).glob("events.out.tfevents.*"))


def test_values_that_are_no_float32_keep_their_own():
    curve = {"a": {1: 0.30000001192092896, 2: 0.1, 3: math.inf, 4: 1e300}}
    back = records.decode_scalars(records.encode_scalars(curve))
    assert back == curve
    assert math.isnan(records.decode_scalars(records.encode_scalars({"a": {1: math.nan}}))["a"][1])


def test_report_options_leave_out_the_sweep_and_the_files_written():
    argv = ["runs/x", "--curves", "runs/x", "--records=f.records.json.xz", "--out", "o", "--seed", "1", "--rec", "g"]
    assert report_cli.report_options(argv, "runs/x") == ["--curves", "runs/x", "--seed", "1"]


def test_packing_a_records_file_again_or_a_missing_one_is_refused(packed, capsys):
    _, file, _ = packed
    assert report_cli.cli([str(file), "--records", str(file)]) == 2
    assert report_cli.cli([str(file.with_name(f"none{records.SUFFIX}"))]) == 2
    err = capsys.readouterr().err
    assert "is a records file already" in err and "does not exist" in err


@pytest.mark.parametrize("rel", ["../escaped/run.json", "/tmp/escaped/run.json"])
def test_a_record_naming_a_path_outside_its_sweep_is_refused_and_nothing_written(tmp_path, capsys, rel):
    file = tmp_path / f"evil{records.SUFFIX}"
    file.write_bytes(
        lzma.compress(json.dumps({"format": 1, "command": [], "files": {rel: "{}"}, "scalars": {}}).encode())
    )
    assert report_cli.cli([str(file), "--out", str(tmp_path / "out")]) == 2
    assert "points outside its sweep" in capsys.readouterr().err
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/escaped").exists()


def test_verdicts_of_several_studies_make_one_table(packed, tmp_path, capsys):
    _, file, _ = packed
    gap = {0: 0.2, 1: 0.21, 2: 0.19}  # kl's accuracy above softmax's, seed by seed
    sweep = grid_sweep(tmp_path / "grid", lrs=(0.001,), value=lambda n, lr, s: 0.5 + (gap[s] if n == "kl" else 0))
    other = tmp_path / f"other{records.SUFFIX}"
    assert (
        report_cli.cli(
            [str(sweep), "--metrics", "test/accuracy", "--records", str(other), "--out", str(tmp_path / "o")]
        )
        == 0
    )
    capsys.readouterr()
    assert report_cli.cli(["--verdicts", str(file), str(other)]) == 0
    table = capsys.readouterr().out.splitlines()
    study, grid = str(file).removesuffix(records.SUFFIX), str(other).removesuffix(records.SUFFIX)
    assert table[:3] == [
        "| study | cell | against | metric | verdict | formed |",
        "|---|---|---|---|---|---|",
        f"| {study} | normalizer=softmax | – | test/accuracy | the baseline | test/accuracy>=0.5: 3 of 3 seeds |",
    ]
    assert table[3] == (
        f"| {study} | normalizer=kl | normalizer=softmax | test/accuracy | not tested: 2 pair(s) | "
        "test/accuracy>=0.5: 2 of 2 seeds |"
    )
    assert table[4].endswith(" | not tested: 2 pair(s) | test/accuracy>=0.5: 0 of 2 seeds |")
    assert table[5] == f"| {grid} | normalizer=softmax | – | test/accuracy | the baseline | – |"
    assert table[6].startswith(f"| {grid} | normalizer=kl | normalizer=softmax | test/accuracy | differs: Δ +0.2 (")
    assert len(table) == 7


def test_a_study_without_a_baseline_lists_each_cell_and_what_formed_in_it(tmp_path, capsys):
    accuracy = {
        ("linear", 0): 0.6,
        ("linear", 1): 0.4,
        ("linear", 2): 0.7,
        ("kl", 0): 0.2,
        ("kl", 1): 0.3,
        ("kl", 2): 0.1,
    }
    sweep = grid_sweep(tmp_path / "grid", norms=("linear", "kl"), lrs=(0.001,), value=lambda n, lr, s: accuracy[n, s])
    study = tmp_path / f"study{records.SUFFIX}"
    options = ["--metrics", "test/accuracy", "--formed", "test/accuracy>=0.5", "--records", str(study)]
    assert report_cli.cli([str(sweep), *options, "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    assert report_cli.cli(["--verdicts", str(study)]) == 0
    name = str(study).removesuffix(records.SUFFIX)
    assert capsys.readouterr().out.splitlines()[2:] == [  # linear: seeds 0 and 2 reach 0.5; kl: none
        f"| {name} | normalizer=kl | – | – | no baseline | test/accuracy>=0.5: 0 of 3 seeds |",
        f"| {name} | normalizer=linear | – | – | no baseline | test/accuracy>=0.5: 2 of 3 seeds |",
    ]


def test_a_study_without_a_baseline_or_a_formation_condition_is_one_row(tmp_path, capsys):
    sweep = grid_sweep(tmp_path / "grid", norms=("linear", "kl"), lrs=(0.001,))  # no softmax: no default baseline
    study = tmp_path / f"study{records.SUFFIX}"
    assert (
        report_cli.cli([str(sweep), "--metrics", "test/accuracy", "--records", str(study), "--out", str(tmp_path)]) == 0
    )
    capsys.readouterr()
    assert report_cli.cli(["--verdicts", str(study)]) == 0
    name = str(study).removesuffix(records.SUFFIX)
    assert capsys.readouterr().out.splitlines()[2:] == [f"| {name} | 2 cells | – | – | no baseline | – |"]


def test_verdicts_and_a_sweep_together_are_refused(packed, capsys):
    _, file, _ = packed
    with pytest.raises(SystemExit):
        report_cli.cli([str(file), "--verdicts", str(file)])
    assert "not both" in capsys.readouterr().err


@pytest.mark.parametrize("options", [OPTIONS, ["--baseline", "normalizer=softmax"]], ids=["packed", "default curves"])
def test_verify_accepts_the_report_the_records_write_and_prints_a_changed_line(packed, options, tmp_path, capsys):
    """--verify composes report.md as a written report does (its curves' images named, a note for a default curve
    no run logged: train/loss) without drawing or writing anything, and prints the lines that differ."""
    _, file, _ = packed
    assert report_cli.cli([str(file), *options, "--out", str(tmp_path / "written")]) == 0
    written = (tmp_path / "written" / "report.md").read_text()
    beside = records.report_beside(file)
    beside.write_text(written)
    before = sorted(tmp_path.rglob("*"))
    capsys.readouterr()
    assert report_cli.cli([str(file), *options, "--verify"]) == exits.COMPLETED
    assert capsys.readouterr().out.splitlines()[-1] == f"{beside} is the report its records write"
    assert sorted(tmp_path.rglob("*")) == before
    assert ("No run logged the scalar train/loss" in written) == (options != OPTIONS)
    beside.write_text(written.replace("7 of 9 runs completed", "8 of 9 runs completed"))
    assert report_cli.cli([str(file), *options, "--verify"]) == exits.FAILED
    diff = capsys.readouterr().out.splitlines()
    assert [line[0] for line in diff if "of 9 runs completed" in line] == ["-", "+"]


def test_verify_is_refused_without_a_records_file_and_the_report_beside_it(packed, tmp_path, capsys):
    sweep, file, _ = packed
    assert report_cli.cli([str(sweep), "--verify"]) == exits.REFUSED
    assert report_cli.cli([str(file), "--verify"]) == exits.REFUSED
    records.report_beside(file).write_text("")
    assert report_cli.cli([str(file), "--verify", "--out", str(tmp_path / "elsewhere")]) == exits.REFUSED
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and "is no records file" in err[0] and "does not exist" in err[1]
    assert "--verify writes nothing" in err[2]
