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


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """pip wheel → a fresh venv whose attnlab is only the wheel's (its dependencies seen through a .pth) →
    (venv, purelib, an environment without PYTHONPATH)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    src = tmp_path / "src_copy"  # build from a copy so the checkout gets no build/ or egg-info
    for part in ("src", "configs"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
    )
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
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"JAX_PLATFORMS": "cpu"}
    return venv, purelib, env


def test_the_wheel_ships_every_package_and_the_configs(wheel_venv):
    """pyproject.toml lists the packages (find cannot map configs/): every one of src/ and every YAML is in it."""
    venv, purelib, env = wheel_venv
    installed = Path(purelib, "attnlab")
    for init in (ROOT / "src" / "attnlab").rglob("__init__.py"):
        assert (installed / init.relative_to(ROOT / "src" / "attnlab")).is_file(), init
    yamls = {p.relative_to(ROOT / "configs") for p in (ROOT / "configs").rglob("*.yaml")}
    assert yamls and yamls == {p.relative_to(installed / "configs") for p in (installed / "configs").rglob("*.yaml")}
    data = [p for p in (ROOT / "src" / "attnlab").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    for file in data:  # the shipped corpora: package data pyproject.toml must name
        assert (installed / file.relative_to(ROOT / "src" / "attnlab")).is_file(), file


def test_the_wheel_installs_and_trains_from_another_directory(wheel_venv, tmp_path):
    """A 5-step run from an empty directory with the wheel's attnlab (~45 s)."""
    venv, purelib, env = wheel_venv
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import attnlab; print(attnlab.__file__)"],
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


# A user's normalizer that lets padding keys through: softmax over every key of the row, the mask ignored.
LEAKY = """
from capped import CappedSoftmax
from attnlab.normalizers import masked_softmax
import jax.numpy as jnp

class Leaky(CappedSoftmax):
    def normalize(self, z_BNTS, m_B1TS):
        weights_BNTS, logits_BNTS, extras = super().normalize(z_BNTS, jnp.ones_like(m_B1TS))
        return weights_BNTS, logits_BNTS, extras
"""
# The user's tiny sizes: a sweep of the user's normalizer against attnlab's on the user's task and head.
USER_SWEEP = [
    "normalizer=capped,softmax",
    "task=majority",
    "task.length=7",
    "task.n_train=64",
    "task.n_val=16",
    "task.n_test=16",
    "head=smoothed_ce",
    "model=tiny",
    "trainer.steps=3",
    "trainer.eval_every=3",
    "trainer.batch_size=8",
    "trainer.progress=none",
]


@pytest.mark.long  # ~90 s: a wheel, a fresh venv and five commands, each a cold start
def test_a_user_project_installed_beside_the_wheel_checks_trains_sweeps_and_reports(wheel_venv, tmp_path):
    """examples/capped installed into the wheel's venv; from an empty directory with its configs as `--config-dir`:
    attnlab-check passes it and fails a leaky variant naming padding; basic and joblib sweeps against softmax;
    the report and TensorBoard's HParams name the user's normalizer."""
    venv, purelib, env = wheel_venv
    bin_ = venv / "bin"
    example = tmp_path / "example"  # installed from a copy: the checkout gets no build/ or egg-info
    shutil.copytree(ROOT / "examples" / "capped", example, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(example)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(bin_ / "python"), "install", "-q", "--no-deps"]
        + [str(w) for w in (tmp_path / "dist").glob("attnlab_capped_example-*.whl")],
        check=True,
    )
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples" / "capped" / "configs", work / "mycfg")

    def run(*argv, ok=True):
        proc = subprocess.run([*map(str, argv)], cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert (proc.returncode == 0) == ok, proc.stderr[-3000:]
        return proc

    run(bin_ / "attnlab-check", "--config-dir", "mycfg", "normalizer=capped", "task=majority", "head=smoothed_ce")
    (work / "leaky.py").write_text(LEAKY)
    (work / "mycfg" / "normalizer" / "leaky.yaml").write_text(
        (work / "mycfg" / "normalizer" / "capped.yaml").read_text().replace("capped.CappedSoftmax", "leaky.Leaky")
    )
    leaky = subprocess.run(
        [str(bin_ / "attnlab-check"), "--config-dir", "mycfg", "normalizer=leaky"],
        cwd=work,
        env={**env, "PYTHONPATH": str(work)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert leaky.returncode == 1 and "normalizer=leaky FAILED" in leaky.stderr and "padding" in leaky.stderr
    for launcher in ("basic", "joblib"):
        sweep = work / launcher
        run(
            bin_ / "attnlab-train",
            "-m",
            "--config-dir",
            "mycfg",
            *USER_SWEEP,
            f"hydra/launcher={launcher}",
            f"hydra.sweep.dir={sweep}",
        )
        jobs = sorted(p.name for p in sweep.iterdir() if (p / "metrics.json").is_file())
        assert jobs == ["0_normalizer=capped", "1_normalizer=softmax"]
        assert {json.loads((sweep / j / "metrics.json").read_text())["status"] for j in jobs} == {"completed"}
    run(bin_ / "attnlab-report", work / "joblib", "--baseline", "normalizer=softmax")
    assert "normalizer=capped" in (work / "joblib" / "report" / "report.md").read_text()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    events = EventAccumulator(str(work / "joblib" / "0_normalizer=capped"))
    events.Reload()
    experiment = metadata.parse_experiment_plugin_data(events.PluginTagToContent("hparams")[metadata.EXPERIMENT_TAG])
    normalizer = next(h for h in experiment.hparam_infos if h.name == "normalizer")
    assert {"capped", "softmax"} <= {v.string_value for v in normalizer.domain_discrete.values}
