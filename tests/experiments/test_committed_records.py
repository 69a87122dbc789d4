"""Committed records regenerate the report beside them: `NAME.records.json.xz` writes `NAME.md` byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.report import cli as report_cli
from attnlab.report import records

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
RECORDS = sorted(EXPERIMENTS.rglob(f"*{records.SUFFIX}"))


def report_beside(file: Path) -> Path:
    """The committed report a records file writes: NAME.md for NAME.records.json.xz."""
    return file.with_name(file.name.removesuffix(records.SUFFIX) + ".md")


def regenerates_its_report(file: Path, out: Path) -> None:
    # report.md names no machine and no date (its provenance line is commit, dirty, jax, device): whole bytes compare
    assert report_cli.cli([str(file), *records.command(file), "--out", str(out)]) == 0
    assert (out / "report.md").read_bytes() == report_beside(file).read_bytes()


if RECORDS:  # an empty parametrization would be reported as a skip; with no records there is no such test

    @pytest.mark.parametrize("file", RECORDS, ids=lambda p: str(p.relative_to(EXPERIMENTS)))
    def test_a_committed_records_file_writes_the_report_beside_it(file, tmp_path):
        regenerates_its_report(file, tmp_path)


def test_every_committed_records_file_names_its_report_and_its_command():
    misnamed = [p for p in EXPERIMENTS.rglob("*records*") if p.is_file() and p.suffix != ".py" and p not in RECORDS]
    assert not misnamed, f"records files are named NAME{records.SUFFIX}, beside NAME.md"
    for file in RECORDS:
        content = records.read(file)
        assert report_beside(file).is_file(), f"{file} has no {report_beside(file).name} beside it"
        assert content["format"] == records.FORMAT and all(isinstance(t, str) for t in content["command"])


def test_the_central_verdict_table_is_the_verdicts_of_every_committed_records_file(monkeypatch, capsys):
    """experiments/verdicts.md (the index's verdict table) is `attnlab-report --verdicts` over every records file."""
    monkeypatch.chdir(EXPERIMENTS)
    names = sorted(str(file.relative_to(EXPERIMENTS)) for file in RECORDS)
    assert report_cli.cli(["--verdicts", *names]) == 0
    assert capsys.readouterr().out == (EXPERIMENTS / "verdicts.md").read_text()
