"""Committed records regenerate the report beside them: `NAME.records.json.xz` writes `NAME.md` byte for byte
(`attnlab-report --verify`, which composes report.md as a written report does without drawing its figures:
tests/report/test_records.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.report import cli as report_cli
from attnlab.report import records

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
RECORDS = sorted(EXPERIMENTS.rglob(f"*{records.SUFFIX}"))


if RECORDS:  # an empty parametrization would be reported as a skip; with no records there is no such test

    @pytest.mark.parametrize("file", RECORDS, ids=lambda p: str(p.relative_to(EXPERIMENTS)))
    def test_a_committed_records_file_writes_the_report_beside_it(file, capsys):
        # report.md names no machine and no date (its provenance line is commit, dirty, jax, device): whole texts
        code = report_cli.cli([str(file), *records.command(file), "--verify"])
        assert code == 0, capsys.readouterr().out[-3000:]


def test_every_committed_records_file_names_its_report_and_its_command():
    misnamed = [p for p in EXPERIMENTS.rglob("*records*") if p.is_file() and p.suffix != ".py" and p not in RECORDS]
    assert not misnamed, f"records files are named NAME{records.SUFFIX}, beside NAME.md"
    for file in RECORDS:
        content = records.read(file)
        assert records.report_beside(file).is_file(), f"{file} has no {records.report_beside(file).name} beside it"
        assert content["format"] == records.FORMAT and all(isinstance(t, str) for t in content["command"])


def test_the_central_verdict_table_is_the_verdicts_of_every_current_records_file(monkeypatch, capsys):
    """experiments/verdicts.md (the index's verdict table) is `attnlab-report --verdicts` over every records file but
    those of a study's superseded designs (its history/ folder)."""
    monkeypatch.chdir(EXPERIMENTS)
    names = sorted(str(file.relative_to(EXPERIMENTS)) for file in RECORDS if "history" not in file.parts)
    assert report_cli.cli(["--verdicts", *names]) == 0
    assert capsys.readouterr().out == (EXPERIMENTS / "verdicts.md").read_text()


# Reports of a study's superseded design, committed before records existed and their runs gone, kept in the study's
# history/ as they were (the README's History section quotes them): the only committed reports without records. The
# set only shrinks.
SUPERSEDED = frozenset(
    {
        "length_extrapolation/history/lm_lr_screen.md",
        "length_extrapolation/history/lm_report.md",
        "length_extrapolation/history/lr_screen.md",
        "length_extrapolation/history/lr_screen_long.md",
        "length_extrapolation/history/lr_screen_none.md",
        "length_extrapolation/history/report.md",
        "lm_normalizers/history/all_lrs.md",
        "lm_normalizers/history/report.md",
        "normalizer_ablation/history/long_report.md",
        "normalizer_ablation/history/report.md",
    }
)


def committed_reports() -> set[str]:
    """Every attnlab-report output committed under experiments/ (a report.md's provenance or method line), as paths
    relative to it."""
    starts = ("Provenance: ", "Metrics of the final parameters over")
    return {
        str(path.relative_to(EXPERIMENTS))
        for path in EXPERIMENTS.rglob("*.md")
        if path.name != "README.md" and any(line.startswith(starts) for line in path.read_text().splitlines())
    }


def test_every_committed_report_but_a_superseded_designs_has_its_records():
    without = {
        name
        for name in committed_reports()
        if not (EXPERIMENTS / name.removesuffix(".md")).with_suffix(records.SUFFIX).is_file()
    }
    assert not without - SUPERSEDED, (
        f"a committed report needs its records beside it (attnlab-report ... --records NAME{records.SUFFIX}): "
        f"{sorted(without - SUPERSEDED)}"
    )
    assert not SUPERSEDED - without, (
        f"these have records now, or are no report: leave SUPERSEDED {sorted(SUPERSEDED - without)}"
    )
    assert all("history" in Path(name).parts for name in SUPERSEDED), "a superseded design's report is in history/"
