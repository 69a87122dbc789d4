"""The studies in experiments/ are reproducible by construction (rules in experiments/README.md, "Rules").

Every Markdown table in a study README carries a marker on the line above it: `<!-- table: FILE -->` (FILE
a committed .md beside the README, e.g. report.md) or `<!-- table: hand-made ... -->`. A FILE table must be
one whole table of FILE, line for line; the reference is the committed file itself, never an edited copy.

Every study is a set of presets in configs/experiment/ (`attnlab-train -m experiment=<name>`), each composing to
the settings of the command line it replaced (BEFORE). The checks read files and compose configs; one test runs
a preset for 2 steps, and the run.sh checks run each script only as far as its REFRESH refusal.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
PRESET_DIR = ROOT / "configs" / "experiment"
# Every preset by its `experiment=` name; `_name_.yaml` files are settings presets share, no preset of their own.
PRESETS = sorted(
    p.relative_to(PRESET_DIR).with_suffix("").as_posix()
    for p in PRESET_DIR.rglob("*.yaml")
    if not p.name.startswith("_")
)
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


@pytest.mark.parametrize("study", [EXPERIMENTS, *STUDIES], ids=lambda p: p.name)
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


STUDY_SCRIPTS = [s / "run.sh" for s in STUDIES] + [EXPERIMENTS / "normalizer_ablation" / "long.sh"]


# study.sh's bracket_screen (a screen whose attnlab-train arguments follow its `--`, the preset among them) and a
# script's own function of attnlab-train runs given the preset as its first argument (`confirm PRESET ...`): their
# calls name the presets; the function's own call, experiment=$preset, names none.
TRAINS_BY_SCREEN = re.compile(r"^(bracket_screen|confirm|screens)\s")
PRESET_ARGUMENT = "experiment=$preset"


def commands(script: Path, program: str) -> list[str]:
    """Each call of `program` in a script, its continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", script.read_text())
    return [line.strip() for line in text.splitlines() if program in line and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_run_sh_parses_and_prints_wall_time(study):
    script = study / "run.sh"
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True).stderr == ""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    first_train = next(i for i, line in enumerate(lines) if "attnlab-train" in line or TRAINS_BY_SCREEN.match(line))
    assert "START=$SECONDS" in lines[:first_train]
    assert lines[-1] == WALL_TIME.format(study=study.name)
    assert (
        "nice -n 10" in text
        and ("hydra.sweep.dir=" in text or "hydra.run.dir=" in text or "bracket_screen" in text)
        and "attnlab-report" in text
    )


@pytest.mark.parametrize("script", STUDY_SCRIPTS, ids=lambda p: p.parent.name + "/" + p.name)
def test_study_script_calls_presets(script):
    """Every attnlab-train of a study script names a preset (its `_gpu` variant too where the call takes SCALE's
    suffix); the study's settings live in the presets, not in shell arrays of overrides."""
    calls = commands(script, '"$BIN/attnlab-train"') + commands(script, "bracket_screen ")
    calls = [c for c in calls if PRESET_ARGUMENT not in c]
    for call in commands(script, "confirm ") + commands(script, "screens "):
        if TRAINS_BY_SCREEN.match(call):
            calls.append("experiment=" + call.split()[1].strip('"'))
    assert calls
    for call in calls:
        named = re.search(r'"?experiment=([\w/$]+)"?', call)
        assert named, f"{script.parent.name}: no preset in: {call}"
        name = named.group(1).replace("$mixer", "softmax").replace("$preset", "reference")
        if name.endswith("$SUFFIX"):
            name = name.removesuffix("$SUFFIX")
            assert f"{name}_gpu" in PRESETS, call
        assert name in PRESETS, call
    text = script.read_text()
    assert not re.search(r"^\s*\w+=\([^)]*\b[\w.]+=", text, flags=re.M), "a shell array of overrides"
    assert 'source "$HERE/../study.sh"' in text and "COPY" not in text


@pytest.mark.parametrize("script", STUDY_SCRIPTS, ids=lambda p: p.parent.name + "/" + p.name)
@pytest.mark.parametrize("how", [["trainer.steps=100"], ["--config-dir", "mycfg", "normalizer=mine"], []])
def test_refresh_refuses_other_settings(script, how, tmp_path):
    """REFRESH=1 copies a report over the study's committed one only for the study's own settings: with extra
    overrides (or SCALE=gpu) the script exits 2 with one line before anything runs (BIN names no program)."""
    env = {**os.environ, "REFRESH": "1", "BIN": str(tmp_path / "no-bin"), "SWEEP": str(tmp_path / "sweep")}
    if not how:
        env["SCALE"] = "gpu"
    proc = subprocess.run(["bash", str(script), *how], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "REFRESH=1 refused" in proc.stderr
    assert not (tmp_path / "sweep").exists()


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


# The study command lines the presets replaced: each `attnlab-train` line of the studies' run.sh (and
# normalizer_ablation/long.sh) before presets, its shell arrays expanded, and for a `_gpu` preset that line with the
# overrides of the study README's GPU command appended (a later value of a key replaces an earlier one, as on
# Hydra's command line). Keys a run.sh gave at run time (the confirm stage's selected rate) are in GIVEN.
_MQAR_SMALL = "task=mqar model=small"
_LE_MQAR = (
    "task=mqar task.seq_len=32 task.n_test=200 task.test_lengths=[32,64,128,256,512] model=small trainer.steps=2000 "
    "trainer.batch_size=32 trainer.eval_every=250 trainer.vmap_seeds=3 trainer.progress=none"
)
_LE_MQAR_GPU = (
    "accelerator=gpu task.seq_len=256 task.num_kv_pairs=16 task.vocab_size=8192 "
    "task.test_lengths=[256,512,1024,2048,4096] task.n_test=1000 trainer.batch_size=256 trainer.steps=5000"
)
_LE_LM = (
    "task=lm task.seq_len=64 task.test_lengths=[64,128,256,512,1024] model=small trainer.steps=400 "
    "trainer.eval_every=50 trainer.vmap_seeds=3 trainer.progress=none"
)
_LE_LM_GPU = (
    "accelerator=gpu model=base task.seq_len=256 task.test_lengths=[256,512,1024,2048,4096] trainer.steps=5000 "
    "trainer.batch_size=256 trainer.eval_every=250"
)
_LD = (
    "task=max_retrieval task.test_lengths=[16,32,64,128,256,512,1024] model=tiny model.layers=1 model.heads=1 "
    "model.positional=none trainer.final_stats=true trainer.steps=2000 trainer.eval_every=500 trainer.vmap_seeds=3 "
    "trainer.progress=none"
)
_LD_GPU = "model.d_model=128 task.test_lengths=[16,64,256,1024,4096,16384] trainer.vmap_seeds=10 accelerator=gpu"
_ALL = "softmax,kl,squared,linear,sigmoid,relu,entmax,softmax1"
_NA = "task=mqar model=small trainer.steps=800 trainer.eval_every=100 trainer.progress=none"
_NA_GPU = (
    "model=base accelerator=gpu trainer.steps=5000 trainer.eval_every=250 trainer.batch_size=256 task.vocab_size=8192 "
    "task.seq_len=256 task.num_kv_pairs=16"
)
_LM = "task=lm task.seq_len=64 model=small trainer.steps=400 trainer.eval_every=50 trainer.progress=none"
_LM_BPE = (  # lm_normalizers since its rerun: the sink papers' setting at model=small's size
    f"{_LM} task.tokenizer=bpe task.bos=true model.norm=rmsnorm model.mlp=swiglu model.positional=rope "
    "trainer.final_stats=true"
)
_LM_STDLIB = f"{_LM_BPE} task.corpus=python_stdlib"  # lm_normalizers since its text stopped repeating
_LM_GPU = (
    "accelerator=gpu model=base task.seq_len=256 trainer.steps=5000 trainer.eval_every=250 trainer.batch_size=256 "
    "optim.lr=3e-4,1e-3,3e-3 task.n_train=200000"
)
# lm_normalizers' _gpu_.yaml (model=llama_60m since its rerun), and it without the screen's rates for the presets that
# run at one rate
_LM_BPE_GPU = _LM_GPU.replace("model=base", "model=llama_60m")
_LM_BPE_GPU_ONE_RATE = _LM_BPE_GPU.replace(" optim.lr=3e-4,1e-3,3e-3", "")
_AS = (
    "task=bigram_backcopy model=small model.layers=1 model.heads=1 model.positional=rope trainer.steps=800 "
    "trainer.batch_size=32 trainer.eval_every=100 trainer.log_every=100 trainer.final_stats=true trainer.vmap_seeds=1 "
    "model.extreme_token_stats=true "
    "trainer.progress=none"
)
_AS_GPU = (
    "accelerator=gpu model.d_model=256 task.seq_len=256 task.n_train=200000 trainer.steps=5000 trainer.eval_every=250 "
    "trainer.log_every=100 trainer.batch_size=512 optim.lr=3e-4,1e-3,3e-3"
)
_AS_LM = f"{_LM} trainer.log_every=25 trainer.final_stats=true trainer.vmap_seeds=1 model.extreme_token_stats=true"
_PAPER = (  # a paper's scale for a GPU: 2048 positions of a 32k BPE, 5000 steps of 32 windows, bfloat16
    "accelerator=gpu task.seq_len=2048 task.tokenizer=bpe task.bpe_vocab_size=32768 task.n_train=1000 "
    "trainer.steps=5000 trainer.eval_every=250 trainer.log_every=100 trainer.batch_size=32 optim.lr=3e-4,1e-3,3e-3"
)
_RC_GPU = "accelerator=gpu task.vocab_size=8192 trainer.steps=5000 trainer.batch_size=256 trainer.vmap_seeds=3"
_MIXERS = {
    "softmax": "normalizer=softmax",
    "linear": "normalizer=linear",
    "linear_conv": "normalizer=linear model.short_conv=4",
    "hybrid": "normalizer=softmax model.layer_normalizers=[linear,softmax]",
    "window": "normalizer=softmax model.window=16",
}


def _recall_capacity(seq_len, pairs, d_model, widths, width_pairs, window, extra=""):
    """recall_capacity/run.sh's mixer(): its pairs sweep and its width sweep, with the script's environment."""
    out = {}
    for mixer, settings in _MIXERS.items():
        settings = settings.replace("model.window=16", f"model.window={window}")
        common = "trainer.steps=800 trainer.eval_every=100 trainer.progress=none"
        out[f"pairs_{mixer}"] = (
            f"task=mqar task.seq_len={seq_len} task.num_kv_pairs={pairs} model=small model.d_model={d_model} "
            f"{settings} {common} {extra}"
        )
        out[f"width_{mixer}"] = (
            f"task=mqar task.seq_len={seq_len} task.num_kv_pairs={width_pairs} model=small model.d_model={widths} "
            f"{settings} {common} {extra}"
        )
    return out


BEFORE = {
    "entropy_collapse": "task=mqar normalizer=softmax optim.lr=3e-3,3e-2 model.qk_norm=false,true model=small "
    "trainer.steps=400 trainer.log_every=20 trainer.eval_every=100 trainer.vmap_seeds=2 trainer.progress=none "
    "trainer.nonfinite=skip",
    "gradient_vs_depth": "task=mqar model.layers=2,4,8 normalizer=softmax,linear,squared,sigmoid model=small "
    "trainer.steps=150 trainer.log_every=5 trainer.eval_every=150 trainer.vmap_seeds=2 trainer.progress=none",
    "learnable_beta": "task=mqar normalizer=softmax normalizer.learnable=true,false model=small trainer.steps=500 "
    "trainer.log_every=25 trainer.eval_every=100 trainer.vmap_seeds=3 trainer.progress=none",
    "linear_vs_softmax": "task=mqar task.num_kv_pairs=2,4,8 task.seq_len=64 normalizer=softmax,linear model=small "
    "trainer.steps=800 trainer.eval_every=100 trainer.vmap_seeds=2 trainer.progress=none",
    "squared_instability": "task=mqar normalizer=squared normalizer.eps=1e-2,1e-6,0 normalizer.offset=false,true "
    "optim.lr=1e-2 trainer.nonfinite=skip model=small trainer.steps=300 trainer.log_every=10 trainer.eval_every=100 "
    "trainer.vmap_seeds=3 trainer.progress=none",
    "final_softmax/classification": "task=digits head=softmax_ce,scores_mse model=small trainer.steps=600 "
    "trainer.eval_every=100 trainer.vmap_seeds=3 trainer.progress=none",
    "final_softmax/regression": "task=icl_regression head=mse,hlgauss task.dim=3 task.n_points=10 model=small "
    "trainer.steps=800 trainer.eval_every=100 trainer.vmap_seeds=3 trainer.progress=none",
    "normalizer_ablation/screen": f"normalizer={_ALL} optim.lr=1e-3,3e-3,1e-2 seed=0 {_NA}",
    "normalizer_ablation/confirm": f"seed=1 trainer.vmap_seeds=2 {_NA}",
    "normalizer_ablation/long_relu": "normalizer=relu optim.lr=3e-3 task=mqar model=small trainer.steps=2000 "
    "trainer.eval_every=250 trainer.vmap_seeds=3 trainer.progress=none",
    "normalizer_ablation/long_sigmoid": "normalizer=sigmoid optim.lr=1e-3 task=mqar model=small trainer.steps=2000 "
    "trainer.eval_every=250 trainer.vmap_seeds=3 trainer.progress=none",
    "lm_normalizers/screen": f"normalizer={_ALL},softpick,sink optim.lr=3e-3,1e-2,3e-2 seed=0 {_LM_STDLIB}",
    "lm_normalizers/confirm": f"seed=1 trainer.vmap_seeds=2 {_LM_STDLIB}",
    "entropy_collapse/lm": f"normalizer=softmax optim.lr=3e-2,1e-1,3e-1 model.qk_norm=false,true seed=0 {_LM_BPE} "
    "trainer.log_every=10",
    "squared_instability/lm": "normalizer=squared normalizer.eps=1e-2,1e-6,0 normalizer.offset=false,true "
    f"optim.lr=3e-2 trainer.nonfinite=skip seed=0 {_LM_BPE} trainer.log_every=10",
    "lm_tokenizers/screen": f"task.tokenizer=bytes,bpe optim.lr=1e-3,3e-3,1e-2 seed=0 {_LM} task.bpe_vocab_size=2048",
    "lm_tokenizers/confirm": f"seed=1 trainer.vmap_seeds=2 {_LM} task.bpe_vocab_size=2048",
    "lm_tokenizers/screen_context": "task.tokenizer=bytes optim.lr=1e-3,3e-3,1e-2 seed=0 task.bpe_vocab_size=2048 "
    + _LM.replace("task.seq_len=64", "task.seq_len=256"),
    "lm_tokenizers/confirm_context": "seed=1 trainer.vmap_seeds=2 task.bpe_vocab_size=2048 "
    + _LM.replace("task.seq_len=64", "task.seq_len=256"),
    "attention_sinks/screen": "normalizer=softmax,relu,softpick,sink,softmax1,sigmoid,forgetting,differential "
    f"optim.lr=1e-3,3e-3,1e-2 seed=0 {_AS}",
    "attention_sinks/screen_gated": "normalizer=softmax model.output_gate=headwise optim.lr=1e-3,3e-3,1e-2 seed=0 "
    + _AS,
    "attention_sinks/screen_sgd": "normalizer=softmax optim=sgd optim.lr=1e-2,3e-2,1e-1 seed=0 " + _AS,
    "attention_sinks/deep": f"normalizer=softmax,relu optim.lr=1e-3,3e-3,1e-2 seed=0 {_AS} model.layers=3",
    "attention_sinks/lm_bos": f"normalizer=softmax task.bos=false,true optim.lr=1e-3,3e-3,1e-2 seed=0 {_AS_LM}",
    "length_dispersion/softmax": f"normalizer=softmax normalizer.learnable=false,true "
    f"normalizer.adaptive_temperature=off,eval {_LD}",
    "length_dispersion/others": f"normalizer=ssmax,sigmoid,stickbreaking {_LD}",
    "length_dispersion/softmax_lr_screen": f"normalizer=softmax normalizer.learnable=false,true "
    f"normalizer.adaptive_temperature=off,eval optim.lr=1e-2,1e-3 {_LD}",
    "length_dispersion/others_lr_screen": f"normalizer=ssmax,sigmoid,stickbreaking optim.lr=1e-2,1e-3 {_LD}",
    "length_extrapolation/screen": "model.positional=rope,none normalizer=softmax,ssmax,stickbreaking,sigmoid,linear "
    f"optim.lr=1e-3,3e-3 {_LE_MQAR}",
    "length_extrapolation/lm_screen": "model.positional=rope,none normalizer=softmax,ssmax,stickbreaking "
    f"optim.lr=3e-3,1e-2,3e-2 {_LE_LM}",
    **{f"recall_capacity/{k}": v for k, v in _recall_capacity(64, "4,8,16", 64, "32,128", 8, 16).items()},
}
BEFORE |= {
    "entropy_collapse_gpu": BEFORE["entropy_collapse"]
    + " model=base accelerator=gpu optim.lr=1e-3,3e-3,1e-2,3e-2,1e-1 "
    "trainer.steps=5000 trainer.batch_size=256 trainer.vmap_seeds=3 task.vocab_size=8192 task.seq_len=256 "
    "task.num_kv_pairs=16",
    "gradient_vs_depth_gpu": BEFORE["gradient_vs_depth"] + " model=base accelerator=gpu model.layers=4,8,16,32 "
    "normalizer=softmax,linear,squared,sigmoid,relu,entmax trainer.steps=500 trainer.vmap_seeds=3",
    "learnable_beta_gpu": BEFORE["learnable_beta"] + " model=base accelerator=gpu trainer.steps=5000 "
    "trainer.batch_size=256 trainer.vmap_seeds=5 task.vocab_size=8192 task.seq_len=256 task.num_kv_pairs=16",
    "linear_vs_softmax_gpu": BEFORE["linear_vs_softmax"] + " model=base accelerator=gpu trainer.steps=10000 "
    "trainer.batch_size=256 task.vocab_size=8192 task.seq_len=512 task.num_kv_pairs=8,32,64 trainer.vmap_seeds=3",
    "squared_instability_gpu": BEFORE["squared_instability"] + " model=base accelerator=gpu trainer.steps=5000 "
    "trainer.log_every=10 trainer.vmap_seeds=5 optim.lr=3e-3,1e-2,3e-2 task.seq_len=256 task.num_kv_pairs=16 "
    "task.vocab_size=8192",
    # final_softmax's README: "for the regression half also task.dim=10 task.n_points=40".
    "final_softmax/classification_gpu": BEFORE["final_softmax/classification"] + " model=base accelerator=gpu "
    "trainer.steps=20000 trainer.batch_size=256 trainer.vmap_seeds=5",
    "final_softmax/regression_gpu": BEFORE["final_softmax/regression"] + " model=base accelerator=gpu "
    "trainer.steps=20000 trainer.batch_size=256 trainer.vmap_seeds=5 task.dim=10 task.n_points=40",
    "normalizer_ablation/screen_gpu": f"{BEFORE['normalizer_ablation/screen']} {_NA_GPU}",
    "normalizer_ablation/confirm_gpu": f"{BEFORE['normalizer_ablation/confirm']} {_NA_GPU}",
    "entropy_collapse/lm_gpu": f"{BEFORE['entropy_collapse/lm']} {_LM_BPE_GPU_ONE_RATE}",
    "squared_instability/lm_gpu": f"{BEFORE['squared_instability/lm']} {_LM_BPE_GPU_ONE_RATE}",
    "lm_normalizers/screen_gpu": f"{BEFORE['lm_normalizers/screen']} {_LM_BPE_GPU}",
    "lm_normalizers/screen_paper": f"{BEFORE['lm_normalizers/screen']} accelerator=gpu model=llama_125m "
    "task.seq_len=2048 task.bos=true task.tokenizer=bpe task.bpe_vocab_size=32768 task.n_train=1000 "
    "trainer.steps=5000 trainer.eval_every=250 trainer.log_every=100 trainer.batch_size=32 optim.lr=3e-4,1e-3,3e-3",
    "attention_sinks/lm_bos_paper": f"{BEFORE['attention_sinks/lm_bos']} {_PAPER} model=llama_60m",
    "lm_tokenizers/screen_paper": f"{BEFORE['lm_tokenizers/screen']} model=llama_125m task.bos=true "
    + _PAPER.replace("task.tokenizer=bpe ", ""),  # the screen's sweep of bytes and bpe
    "attention_sinks/screen_gpu": f"{BEFORE['attention_sinks/screen']} {_AS_GPU}",
    "attention_sinks/screen_gated_gpu": f"{BEFORE['attention_sinks/screen_gated']} {_AS_GPU}",
    "attention_sinks/screen_sgd_gpu": f"{BEFORE['attention_sinks/screen_sgd']} {_AS_GPU} optim.lr=3e-3,1e-2,3e-2",
    "attention_sinks/deep_gpu": f"{BEFORE['attention_sinks/deep']} {_AS_GPU}",
    "attention_sinks/lm_bos_gpu": f"{BEFORE['attention_sinks/lm_bos']} {_LM_GPU} trainer.log_every=100",
    # The confirm stage takes the rate the screen selected, not the README's swept rates.
    "lm_normalizers/confirm_gpu": f"{BEFORE['lm_normalizers/confirm']} {_LM_BPE_GPU_ONE_RATE}",
    "lm_tokenizers/screen_gpu": f"{BEFORE['lm_tokenizers/screen']} {_LM_GPU}",
    "lm_tokenizers/screen_context_gpu": f"{BEFORE['lm_tokenizers/screen_context']} {_LM_GPU}".replace(
        "task.seq_len=256", "task.seq_len=1024"
    ),
    "lm_tokenizers/confirm_context_gpu": f"{BEFORE['lm_tokenizers/confirm_context']} "
    + _LM_GPU.replace(" optim.lr=3e-4,1e-3,3e-3", "").replace("task.seq_len=256", "task.seq_len=1024"),
    "lm_tokenizers/confirm_gpu": f"{BEFORE['lm_tokenizers/confirm']} "
    + _LM_GPU.replace(" optim.lr=3e-4,1e-3,3e-3", ""),
    **{
        f"length_dispersion/{part}_gpu": f"{BEFORE[f'length_dispersion/{part}']} {_LD_GPU}"
        for part in ("softmax", "others", "softmax_lr_screen", "others_lr_screen")
    },
    **{
        f"{name}_gpu": f"{BEFORE[name]} {_LE_LM_GPU if '/lm_' in name else _LE_MQAR_GPU}"
        for name in list(BEFORE)
        if name.startswith("length_extrapolation/")
    },
    **{
        f"recall_capacity/{k}_gpu": v
        for k, v in _recall_capacity(256, "16,32,64", 128, "64,256,512", 32, 64, _RC_GPU).items()
    },
}
# experiment=<study> for a study of several sweeps: its principal sweep (the whole study is its run.sh), in a few
# studies with more normalizers in the one sweep, each job one of the study's cells.
_STUDY_SWEEPS = {
    "final_softmax": ("final_softmax/classification", ""),
    "normalizer_ablation": ("normalizer_ablation/screen", ""),
    "lm_normalizers": ("lm_normalizers/screen", ""),
    "lm_tokenizers": ("lm_tokenizers/screen", ""),
    "attention_sinks": ("attention_sinks/screen", ""),
    "length_dispersion": ("length_dispersion/others", "normalizer=softmax,ssmax,sigmoid,stickbreaking"),
    "length_extrapolation": ("length_extrapolation/screen", ""),
    "recall_capacity": ("recall_capacity/pairs_softmax", "normalizer=softmax,linear"),
}
for _study, (_part, _more) in _STUDY_SWEEPS.items():
    BEFORE[_study] = f"{BEFORE[_part]} {_more}"
    BEFORE[f"{_study}_gpu"] = f"{BEFORE[_part + '_gpu']} {_more}"
BEFORE["sink_formation/reference"] = (
    "task=bigram_backcopy model=small head=softmax_ce task.fresh=true model.layers=1 model.heads=1 "
    "model.positional=learned model.max_len=64 model.mlp=relu model.bias=false model.embed_std=1.0 head.bias=false "
    "optim.lr=1e-2 optim.warmup_steps=0 optim.final_fraction=1.0 optim.weight_decay=1e-4 optim.b2=0.99 "
    "optim.clip_norm=1e30 trainer.steps=1000 trainer.batch_size=64 trainer.log_every=100 trainer.eval_every=250 "
    "trainer.final_stats=true seed=0 trainer.vmap_seeds=3 trainer.progress=none"
)
_SINK_DIFFERENCES = {  # sink_formation/<name>: the reference with one difference
    "embed_std": "model.embed_std=null",
    "fixed_set": "task.fresh=false",
    "rope": "model.positional=rope",
    "mlp_bias": "model.bias=null",
    "gelu": "model.mlp=gelu",
    "head_bias": "head.bias=true",
    "weight_decay": "optim.weight_decay=0.1",
    "b2": "optim.b2=0.98",
    "clip": "optim.clip_norm=1.0",
    "schedule": "optim.warmup_steps=100 optim.final_fraction=0.1",
    "budget": "trainer.steps=800 trainer.batch_size=32",
}
BEFORE["sink_formation"] = BEFORE["sink_formation/reference"]
BEFORE["sink_formation_gpu"] = BEFORE["sink_formation/reference"].replace(
    "trainer.log_every=100 trainer.eval_every=250", "trainer.log_every=500 trainer.eval_every=1000"
) + (" task.seq_len=256 model.d_model=256 model.max_len=256 optim.lr=3e-4 trainer.steps=10000 trainer.batch_size=512")
for _name, _difference in _SINK_DIFFERENCES.items():
    BEFORE[f"sink_formation/{_name}"] = f"{BEFORE['sink_formation/reference']} {_difference}"
BEFORE["attention_sinks/guo"] = (
    f"{BEFORE['sink_formation/reference']} normalizer=softmax,relu,softpick,sink optim.lr=3e-3,1e-2,3e-2 seed=0 "
    "trainer.vmap_seeds=3"
)
BEFORE["attention_sinks/guo_deep"] = (
    f"{BEFORE['sink_formation/reference']} model.layers=3 optim.lr=3e-3,1e-2,3e-2 seed=0 trainer.vmap_seeds=3"
)

GIVEN = {  # run.sh gives the confirm stage a normalizer and its selected rate: any pair stands for them here
    name: "normalizer=kl optim.lr=1e-2" for name in BEFORE if "/confirm" in name
}


# The console's setting (a bar, lines or nothing), not the study's: the old lines silenced it, presets leave it be.
CONSOLE_KEYS = {("trainer", "progress")}


def split_overrides(command: str) -> tuple[list[str], dict[str, list[str]]]:
    """A command line's fixed overrides (a later value of a key replacing an earlier one) and its swept keys."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    fixed, swept = {}, {}
    for o in OverridesParser.create().parse_overrides(shlex.split(command)):
        key = o.get_key_element()
        fixed.pop(key, None)
        swept.pop(key, None)
        if o.is_sweep_override():
            swept[key] = list(o.sweep_string_iterator())
        else:
            fixed[key] = o.input_line
    return list(fixed.values()), swept


@pytest.fixture(scope="module")
def compose():
    """Hydra's compose API over attnlab's configs: configs/train.yaml with a list of overrides, hydra node included."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from attnlab.config import registry

    with initialize_config_dir(config_dir=str(registry.CONFIG_DIR), version_base=None):
        yield lambda overrides: hydra_compose("train", overrides=overrides, return_hydra_config=True)


def settings(cfg) -> dict:
    """A composed config without Hydra's node and the console's keys."""
    from omegaconf import OmegaConf

    out = OmegaConf.to_container(cfg, resolve=False)
    out.pop("hydra")
    for group, key in CONSOLE_KEYS:
        out[group].pop(key)
    return out


def test_every_study_command_is_a_preset():
    assert sorted(BEFORE) == PRESETS


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_every_study_is_a_preset_at_both_scales(study):
    """`attnlab-train -m experiment=<study>` for every study, and its README's GPU scale as `<study>_gpu`."""
    assert study.name in PRESETS and f"{study.name}_gpu" in PRESETS


# The CPU-scale presets by default; each study's GPU scale (`_gpu`, `_paper`: the same preset with larger sizes, whose
# existence test_every_study_is_a_preset_at_both_scales checks by default) under `long` (~0.35 s of Hydra a preset).
CPU_FIRST = [pytest.param(p, marks=[pytest.mark.long] if p.endswith(("_gpu", "_paper")) else []) for p in PRESETS]


@pytest.mark.parametrize("preset", CPU_FIRST)
def test_preset_composes_to_the_command_it_replaced(preset, compose):
    """The preset sweeps the same values as the old command, and its first job's config equals the old command's
    first job's (the jobs differ only in the swept keys, so every job is equal)."""
    given = shlex.split(GIVEN.get(preset, ""))
    fixed, swept = split_overrides(BEFORE[preset])
    first_job = [f"{key}={values[0]}" for key, values in swept.items()]
    cfg = compose([f"experiment={preset}", *given, *first_job])  # the command line leaves the sweep's values alone
    params = cfg.hydra.sweeper.params or {}
    assert split_overrides(" ".join(f"{k}={v}" for k, v in params.items())) == ([], swept)
    assert settings(cfg) == settings(compose([*fixed, *given, *first_job]))
    assert cfg.hydra.runtime.choices.experiment == preset


@pytest.mark.long  # every swept combination of every preset composed (~40 s)
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_passes_attnlab_composition_check(preset):
    """attnlab's own check of a command line (each swept choice composed, unknown keys refused) does not exit."""
    from attnlab.config.composition import compose_or_exit
    from attnlab.platforms import platform_installed

    # a GPU preset where JAX has no GPU support is refused as a whole (the next test); its composition is checked here
    on_cpu = [] if platform_installed("gpu") or not preset.endswith(("_gpu", "_paper")) else ["accelerator=cpu"]
    compose_or_exit(["-m", f"experiment={preset}", *shlex.split(GIVEN.get(preset, "")), *on_cpu])


def test_a_gpu_preset_where_jax_has_no_gpu_is_refused_in_one_line_naming_the_gpu_command(capsys):
    from attnlab.config.composition import compose_or_exit
    from attnlab.platforms import platform_installed

    if platform_installed("gpu"):
        pytest.skip("this environment has JAX's GPU support: the preset's jobs would run or fail on their own")
    with pytest.raises(SystemExit) as exc:
        compose_or_exit(["-m", "experiment=lm_normalizers/screen_paper"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert "run it on a GPU machine: attnlab-train -m experiment=lm_normalizers/screen_paper;" in err[0]


def test_preset_runs_its_sweep(tmp_path):
    """`attnlab-train -m experiment=learnable_beta` at a tiny scale: the preset's sweep (normalizer.learnable
    true, false) runs as two jobs with the preset's settings under the command line's overrides."""
    import json

    from cli_helpers import TINY, tiny_task, train_in_process

    sweep = tmp_path / "sweep"
    overrides = [*TINY, *tiny_task("mqar"), "trainer.steps=2", "trainer.eval_every=2", "trainer.vmap_seeds=1"]
    train_in_process("-m", "experiment=learnable_beta", *overrides, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    runs = sorted(sweep.glob("*/run.json"))
    configs = [json.loads(r.read_text())["config"] for r in runs]
    assert sorted(c["normalizer"]["learnable"] for c in configs) == [False, True]
    assert {(c["trainer"]["steps"], c["trainer"]["log_every"], c["model"]["d_model"]) for c in configs} == {(2, 2, 16)}


# A report metric that is a final attention statistic (computed with trainer.final_stats on), and a script's commands.
FINAL_STATISTIC = re.compile(r"\btest(?:_len/[^/\s']+)?/attn_")
TRAINED = re.compile(r"attnlab-train\" -m \"experiment=([\w/]+)\$SUFFIX\".*hydra\.sweep\.dir=\$\{?(\w+)")
REPORTED = re.compile(r"attnlab-report\" \"\$\{?(\w+)")


def final_statistic_presets() -> list[tuple[str, str]]:
    """(preset, script) for each preset a study script trains into a sweep that the script then reports with a final
    attention statistic among its metrics."""
    out = set()
    for script in sorted(EXPERIMENTS.glob("*/*.sh")):
        commands = script.read_text().replace("\\\n", " ").splitlines()
        reported = {m.group(1) for c in commands if (m := REPORTED.search(c)) and FINAL_STATISTIC.search(c)}
        trained = [m.groups() for c in commands if (m := TRAINED.search(c))]
        out |= {(preset, script.relative_to(EXPERIMENTS).as_posix()) for preset, sweep in trained if sweep in reported}
    return sorted(out)


@pytest.mark.parametrize("preset, script", final_statistic_presets(), ids=lambda x: x)
def test_a_preset_whose_report_reads_final_attention_statistics_computes_them(preset, script, compose):
    """trainer.final_stats is off by default (on under a task that measures attention sinks): a study that reports
    test/attn_* or test_len/T/attn_* must switch it on, or its report refuses the metric after the training."""
    from attnlab.config import registry

    cfg = compose([f"experiment={preset}"])
    measures_sinks = getattr(registry.resolve_target(cfg.task["_target_"], "task"), "measures_sinks", False)
    assert cfg.trainer.final_stats or (cfg.trainer.final_stats is None and measures_sinks), (preset, script)
