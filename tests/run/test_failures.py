"""Bugs look like bugs: only bad input (checks.ConfigError) is the one-line exit-2 refusal; any other exception
while building a run is a failed run with its traceback saved and its path printed."""

from __future__ import annotations

import os
import subprocess
import sys

from cli_helpers import TINY, metrics, tiny_task

# The real CLI with a bug planted where the model is built: a ValueError that no check raised.
PLANTED = """
import sys
import attnlab.model
def broken(*args, **kwargs):
    raise ValueError("planted bug in Transformer.__init__")
attnlab.model.Transformer.__init__ = broken
from attnlab.cli import train_main
train_main()
"""


def test_a_value_error_inside_build_is_a_failed_run_with_its_traceback(tmp_path):
    run_dir = tmp_path / "r"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", PLANTED, *TINY, *tiny_task("mqar"), f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "attnlab: error:" not in proc.stderr  # not disguised as a configuration error
    assert (
        f"attnlab: run failed: ValueError: planted bug in Transformer.__init__ (traceback in {run_dir / 'error.txt'})"
    ) in proc.stderr
    trace = (run_dir / "error.txt").read_text()
    assert trace.startswith("Traceback") and "in broken" in trace and "in make_net" in trace
    m = metrics(run_dir)
    assert m["status"] == "failed" and m["error"] == "ValueError: planted bug in Transformer.__init__"
