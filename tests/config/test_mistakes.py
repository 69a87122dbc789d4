"""A newcomer's command-line mistakes, through the real entry point: one line with the fix, exit 2, no directory."""

from __future__ import annotations

import pytest
from cli_helpers import train_in_process


@pytest.mark.parametrize(
    "argv, line",
    [
        (["steps=100"], "steps is not a key of the config (did you mean trainer.steps?)"),
        (["+steps=100"], "unknown key(s) steps (did you mean trainer.steps?); allowed at the top level: compile_cache"),
        (["lr=0.1"], "lr is not a key of the config (did you mean optim.lr?)"),
        (["trainer.step=5"], "trainer.step is not a key of the config (did you mean trainer.steps?)"),
        (["+trainer.stepz=5"], "unknown key(s) trainer.stepz (did you mean trainer.steps?); allowed: attn_map_scale"),
        (
            ["normalizer=softmx"],
            "normalizer=softmx unknown (did you mean softmax?); allowed: differential, entmax, forgetting, kl",
        ),
        (
            ["normalizer=softmax,linear"],
            "several values need -m for a sweep: attnlab-train -m normalizer=softmax,linear",
        ),
        (
            ["--normalizer", "softmax"],
            "--normalizer is not an option; overrides are key=value, e.g. normalizer=softmax",
        ),
        (["--trainer.steps=5"], "--trainer.steps=5 is not an option; overrides are key=value, e.g. trainer.steps=5"),
        (
            ["-m", "normalizer=softmax,", "linear"],
            "a space after the comma in normalizer=softmax, linear; remove it: normalizer=softmax,linear",
        ),
        (
            ["-m", "normalizer=softmax", ",linear"],
            "a space before the comma in normalizer=softmax ,linear; remove it: normalizer=softmax,linear",
        ),
        (["linear"], "'linear' is not an override; overrides are key=value, e.g. normalizer=linear"),
        (["normalizer", "kl"], "'normalizer' is not an override; overrides are key=value, e.g. normalizer=kl"),
        (["normalizer:", "kl"], "'normalizer:' is not an override; overrides are key=value, e.g. normalizer=kl"),
        (["optim.learning_rate=0.01"], "optim.learning_rate is not a key of the config (did you mean optim.lr?)"),
        (["accelerator=cuda"], "accelerator=cuda unknown (did you mean gpu?); allowed: auto, cpu, gpu, tpu"),
        (["task=MQAR"], "task=MQAR unknown (did you mean mqar?)"),
    ],
)
def test_mistake_is_one_line_with_the_fix_and_exit_2(tmp_path, argv, line):
    run_dir = tmp_path / "r"
    proc = train_in_process(
        *argv, "trainer.steps=1", f"hydra.run.dir={run_dir}", f"hydra.sweep.dir={run_dir}", cwd=tmp_path, check=False
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"attnlab: error: {line}"), proc.stderr
    assert not run_dir.exists()


def test_a_list_value_is_not_taken_for_a_sweep(tmp_path):
    """Brackets are a list (the hybrid layout), not several values: composition goes on to the model check."""
    proc = train_in_process(
        "model.layer_normalizers=[softmax,bogus]", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path, check=False
    )
    assert proc.returncode == 2 and "names unknown normalizer(s) bogus" in proc.stderr, proc.stderr
