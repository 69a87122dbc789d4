"""The studies in experiments/ are reproducible by construction (rules in experiments/README.md, "Rules").

Every Markdown table in a study README carries a marker on the line above it: `<!-- table: FILE -->` (FILE
a committed .md beside the README, e.g. report.md) or `<!-- table: hand-made ... -->`. A FILE table must be
one whole table of FILE, line for line; the reference is the committed file itself, never an edited copy.
No training runs here: the checks read files only (and `bash -n` parses each run.sh).
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
STUDIES = sorted(p.parent for p in EXPERIMENTS.glob("*/README.md"))
MARKER = re.compile(r"^<!--\s*table:\s*(.+?)\s*-->$")
MACHINE_PATH = re.compile(r"(?<![\w.$])(/work/|/root/|/home/|/Users/|~/)")
WALL_TIME = 'echo "{study}: wall time $((SECONDS - START)) s"'


def markdown_tables(text: str) -> list[tuple[int, str | None, list[str]]]:
    """(1-based line, marker or None, stripped rows) of every table outside fenced code blocks."""
    tables, rows, start, fenced = [], [], 0, False
    lines = text.splitlines()
    for i, line in enumerate(lines + [""]):
        s = line.strip()
        if s.startswith("```"):
            fenced = not fenced
        if not fenced and s.startswith("|"):
            if not rows:
                start = i
            rows.append(s)
            continue
        if rows:
            above = next((x.strip() for x in reversed(lines[:start]) if x.strip()), "")
            m = MARKER.match(above)
            tables.append((start + 1, m.group(1) if m else None, rows))
            rows = []
    return tables


def table_problems(readme: Path) -> list[str]:
    """Why a README's tables break the rule; empty when they follow it."""
    folder, problems = readme.parent, []
    for line, marker, rows in markdown_tables(readme.read_text()):
        where = f"{readme.relative_to(EXPERIMENTS)}:{line}"
        if marker is None:
            problems.append(f"{where}: table without a '<!-- table: FILE -->' or '<!-- table: hand-made -->' marker")
        elif marker.startswith("hand-made"):
            for other in sorted(folder.rglob("*.md")):
                if other != readme and rows[0] in {t[0] for _, _, t in markdown_tables(other.read_text())}:
                    problems.append(f"{where}: marked hand-made but has the header of a table in "
                                    f"{other.relative_to(folder)}; cite that file")
        else:
            source = folder / marker
            if not source.is_file():
                problems.append(f"{where}: cites {marker}, which is not a file beside the README")
            elif rows not in [t for _, _, t in markdown_tables(source.read_text())]:
                problems.append(f"{where}: differs from every table in {marker}; paste that table unedited")
    return problems


def test_markdown_tables_parses_markers_fences_and_indentation():
    text = ("intro\n\n<!-- table: report.md -->\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```\n| in | code |\n```\n"
            "- item\n\n  <!-- table: hand-made (events) -->\n  | c |\n  |---|\n\n| bare |\n")
    assert markdown_tables(text) == [(5, "report.md", ["| a | b |", "|---|---|", "| 1 | 2 |"]),
                                     (15, "hand-made (events)", ["| c |", "|---|"]),
                                     (18, None, ["| bare |"])]


def test_table_check_catches_a_drifted_cell(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "EXPERIMENTS", tmp_path)
    study = tmp_path / "s"
    study.mkdir()
    (study / "report.md").write_text("# r\n\n| n | acc |\n|---|---|\n| 3 | 0.99 |\n")
    readme = study / "README.md"
    readme.write_text("<!-- table: report.md -->\n| n | acc |\n|---|---|\n| 3 | 0.99 |\n")
    assert table_problems(readme) == []
    readme.write_text("<!-- table: report.md -->\n| n | acc |\n|---|---|\n| 3 | 0.98 |\n")
    assert table_problems(readme) == ["s/README.md:2: differs from every table in report.md; paste that table unedited"]
    readme.write_text("<!-- table: hand-made -->\n| n | acc |\n|---|---|\n| 3 | 0.98 |\n")
    assert "marked hand-made but has the header of a table in report.md" in table_problems(readme)[0]


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_readme_tables_are_the_committed_reports(study):
    assert table_problems(study / "README.md") == []


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_readme_figures_exist(study):
    links = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", (study / "README.md").read_text())
    assert [link for link in links if not (study / link).is_file()] == []


@pytest.mark.parametrize("readme", [EXPERIMENTS / "README.md"] + [s / "README.md" for s in STUDIES],
                         ids=lambda p: p.parent.name)
def test_no_machine_paths(readme):
    """Seeds are named by file name (004_434f49fb84cb7207.txt), never by where one machine keeps them."""
    hits = [f"{n}: {line.strip()}" for n, line in enumerate(readme.read_text().splitlines(), 1)
            if MACHINE_PATH.search(line)]
    assert hits == []


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_run_sh_parses_and_prints_wall_time(study):
    script = study / "run.sh"
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True).stderr == ""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    first_train = next(i for i, line in enumerate(lines) if "attnlab-train" in line)
    assert "START=$SECONDS" in lines[:first_train]
    assert lines[-1] == WALL_TIME.format(study=study.name)
    assert "nice -n 10" in text and "hydra.sweep.dir=" in text and "attnlab-report" in text


def test_index_lists_every_study():
    index = (EXPERIMENTS / "README.md").read_text()
    listed = set(re.findall(r"^\| \[(\w+)\]\((\w+)/\) \|", index, flags=re.M))
    assert listed == {(s.name, s.name) for s in STUDIES}
