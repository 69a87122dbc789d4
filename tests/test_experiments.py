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
                    problems.append(
                        f"{where}: marked hand-made but has the header of a table in "
                        f"{other.relative_to(folder)}; cite that file"
                    )
        else:
            source = folder / marker
            if not source.is_file():
                problems.append(f"{where}: cites {marker}, which is not a file beside the README")
            elif rows not in [t for _, _, t in markdown_tables(source.read_text())]:
                problems.append(f"{where}: differs from every table in {marker}; paste that table unedited")
    return problems


def test_markdown_tables_parses_markers_fences_and_indentation():
    text = (
        "intro\n\n<!-- table: report.md -->\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```\n| in | code |\n```\n"
        "- item\n\n  <!-- table: hand-made (events) -->\n  | c |\n  |---|\n\n| bare |\n"
    )
    assert markdown_tables(text) == [
        (5, "report.md", ["| a | b |", "|---|---|", "| 1 | 2 |"]),
        (15, "hand-made (events)", ["| c |", "|---|"]),
        (18, None, ["| bare |"]),
    ]


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


@pytest.mark.parametrize(
    "readme", [EXPERIMENTS / "README.md"] + [s / "README.md" for s in STUDIES], ids=lambda p: p.parent.name
)
def test_no_machine_paths(readme):
    """Seeds are named by file name (004_434f49fb84cb7207.txt), never by where one machine keeps them."""
    hits = [
        f"{n}: {line.strip()}" for n, line in enumerate(readme.read_text().splitlines(), 1) if MACHINE_PATH.search(line)
    ]
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


def test_recall_capacity_tables_from_runs():
    """capacity.py's pivot against hand-computed means: mixer names, fixed keys, failed runs left out."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("capacity", EXPERIMENTS / "recall_capacity" / "capacity.py")
    capacity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capacity)

    def run(acc, d, pairs, status="completed", **cfg):
        config = {
            "normalizer": "softmax",
            "model.d_model": d,
            "task.num_kv_pairs": pairs,
            "model.short_conv": 0,
            "model.layer_normalizers": None,
            "model.window": None,
            **cfg,
        }
        return SimpleNamespace(config=config, value=lambda m, w: acc if status == "completed" else None)

    runs = [
        run(1.0, 64, 4),
        run(0.9, 64, 4),
        run(0.5, 64, 8),
        run(0.2, 32, 8),
        run(0.3, 64, 4, normalizer="linear", **{"model.short_conv": 4}),
        run(0.7, 64, 4, status="failed", normalizer="linear"),
        run(0.6, 64, 8, **{"model.layer_normalizers": '["linear", "softmax"]'}),
        run(0.4, 64, 8, **{"model.window": 16}),
    ]
    cols, rows = capacity.pivot(runs, "task.num_kv_pairs", {"model.d_model": 64})
    assert cols == [4, 8]
    assert rows == {
        "linear, short_conv 4": {4: [0.3]},
        "linear/softmax": {8: [0.6]},
        "softmax": {4: [1.0, 0.9], 8: [0.5]},
        "softmax, window 16": {8: [0.4]},
    }
    assert capacity.cell_text([1.0, 0.9]) == "0.950 ± 0.071 (2)"  # std ddof=1: 0.1/sqrt(2)
    cols, rows = capacity.pivot(runs, "model.d_model", {"task.num_kv_pairs": 8})
    assert cols == [32, 64] and rows["softmax"] == {32: [0.2], 64: [0.5]}


def test_recall_capacity_reads_run_directories(tmp_path, capsys):
    """capacity.py through attnlab's own loader: run.json config + choices, metrics.json final, the list key."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("capacity", EXPERIMENTS / "recall_capacity" / "capacity.py")
    capacity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capacity)
    for i, (layers, acc) in enumerate([(None, 0.5), (["linear", "softmax"], 0.75), (["linear", "softmax"], 0.25)]):
        run = tmp_path / f"{i}_job"
        run.mkdir()
        config = {
            "seed": i,
            "model": {"d_model": 64, "heads": 4, "short_conv": 0, "layer_normalizers": layers, "window": None},
            "task": {"num_kv_pairs": 8},
        }
        (run / "run.json").write_text(json.dumps({"config": config, "choices": {"normalizer": "softmax"}}))
        (run / "metrics.json").write_text(json.dumps({"status": "completed", "final": {"test/accuracy": acc}}))
    capacity.main([str(tmp_path), "--d-model", "64", "--pairs", "8"])
    out = capsys.readouterr().out
    assert "| linear/softmax | 0.500 ± 0.354 (2) |" in out  # mean of 0.75, 0.25; std 0.5/sqrt(2)
    assert "| softmax | 0.500 ± nan (1) |" in out
    assert "| linear state per layer (heads × head_dim²) | 1024 |" in out  # 4 heads × 16²


def test_lm_baselines_table_and_mixed_corpora(tmp_path, capsys):
    """baselines.py prints the runs' shared baselines and refuses runs whose corpora differ."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("baselines", EXPERIMENTS / "lm_normalizers" / "baselines.py")
    baselines = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baselines)
    base = {"baseline/bits_per_byte": 4.56789, "baseline/bits_per_byte_bigram": 3.5, "baseline/accuracy": 0.17}
    for i, status in enumerate(["completed", "completed", "failed"]):
        (tmp_path / f"run{i}").mkdir()
        record = {"status": status, "baseline": base if status == "completed" else {}}
        (tmp_path / f"run{i}" / "metrics.json").write_text(json.dumps(record))
    baselines.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "identical in all 2 completed runs" in out
    assert "| unigram entropy of the training text (bits per byte) | 4.5679 |" in out
    (tmp_path / "run3").mkdir()
    other = {"status": "completed", "baseline": {**base, "baseline/bits_per_byte": 4.0}}
    (tmp_path / "run3" / "metrics.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="one corpus and split per sweep"):
        baselines.main([str(tmp_path)])
