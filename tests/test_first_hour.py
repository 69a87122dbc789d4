"""What a newcomer sees on the first run: no backend-probing noise, a val curve, a summary that says what ran."""

from __future__ import annotations

import os
import subprocess
import sys

from cli_helpers import CACHE, TINY_TASK


def test_no_backend_probing_line_on_the_console_or_in_the_log(tmp_path):
    """accelerator=auto with no JAX_PLATFORMS: JAX probes for a TPU and logs 'Unable to initialize backend' at INFO."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"} | {"HYDRA_FULL_ERROR": "0"}
    run_dir = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "attnlab", "model=tiny", "accelerator=auto", "trainer.steps=2",
                           "trainer.progress=none", f"compile_cache={CACHE}", *TINY_TASK["mqar"],
                           f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = "".join(p.read_text() for p in run_dir.glob("*.log"))
    for text in (proc.stdout, proc.stderr, logs):
        assert "Unable to initialize backend" not in text and "xla_bridge" not in text, text
