"""A user who does not clone: build the wheel, install it into a fresh venv, train from another directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from attnlab.run import record

ROOT = Path(__file__).resolve().parents[1]


def test_git_state_outside_a_checkout_says_so(tmp_path, monkeypatch):
    """An installed package (site-packages/attnlab, even inside someone else's repository) records no SHA."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # the user's own repository around the venv
    fake = tmp_path / "lib" / "site-packages" / "attnlab" / "run" / "record.py"
    fake.parent.mkdir(parents=True)
    monkeypatch.setattr(record, "__file__", str(fake))
    state = record.git_state()
    assert state["sha"] is None and state["dirty"] is None and state["note"] == "not a git checkout"


def test_git_state_in_this_checkout_has_the_sha():
    if not (ROOT / ".git").exists():
        pytest.skip("tests run outside a git checkout")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert record.git_state()["sha"] == head


def test_the_wheel_installs_and_trains_from_another_directory(tmp_path):
    """pip wheel → fresh venv (deps seen through a .pth, attnlab only from the wheel) → a 5-step run (~45 s)."""
    src = tmp_path / "src_copy"  # build from a copy so the checkout gets no build/ or egg-info
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0 and "setuptools" in built.stderr and "No matching distribution" in built.stderr:
        pytest.skip("pip cannot fetch the build backend (no network, empty cache)")
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next(dist.glob("attnlab-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)], check=True
    )
    # The dependencies from this interpreter's site-packages, as a plain path: its .pth files (the
    # editable attnlab) are not processed, so `import attnlab` can only find the wheel's copy.
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"JAX_PLATFORMS": "cpu"}
    where = subprocess.run(
        [str(py), "-c", "import attnlab; print(attnlab.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(purelib), where
    run_dir = elsewhere / "run"
    proc = subprocess.run(
        [
            str(venv / "bin" / "attnlab-train"),
            "trainer.steps=5",
            "model=tiny",
            "trainer.progress=none",
            "task.n_train=200",
            "task.n_val=40",
            "task.n_test=40",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["steps"] == 5
    git = json.loads((run_dir / "run.json").read_text())["env"]["git"]
    assert git["sha"] is None and git["note"] == "not a git checkout" and git["version"] == "0.1.0"
