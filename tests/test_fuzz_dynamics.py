"""Fuzzed training dynamics: random learning rates, normalizers and normalizer options (eps=0, a huge β), a few
steps each; every run ends `completed` with finite metrics or `diverged` with finite-or-absent ones, and no
non-finite value reaches TensorBoard. (tests/test_fuzz.py fuzzes the refusals.)"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from cli_helpers import CACHE, events, tiny_task
from fuzz_space import BASE, outcome
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab import cli
from attnlab.config import registry

STEPS = 6


@st.composite
def dynamics(draw):
    """A normalizer, a learning rate from 1e-5 to 1e6 and, for the normalizers that have them, a drawn eps or β."""
    normalizer = draw(st.sampled_from(registry.choices("normalizer")))
    lr = 10 ** draw(st.floats(-5, 6))
    overrides = [
        "task=mqar",
        *tiny_task("mqar"),
        f"normalizer={normalizer}",
        f"optim.lr={lr:.3g}",
        f"optim.warmup_steps={draw(st.sampled_from([0, 2]))}",
    ]
    options = registry.load("normalizer", normalizer)
    if "eps" in options and draw(st.booleans()):
        overrides.append(f"normalizer.eps={draw(st.sampled_from([0, 1e-30, 1e-6]))}")
    if "beta" in options and draw(st.booleans()):
        overrides.append(f"normalizer.beta={draw(st.sampled_from([1e-3, 1.0, 1e4]))}")
    return overrides


def finite(values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def run_dynamics(overrides: list[str], tmp_dir) -> str:
    kind, detail = outcome(overrides)
    assert kind == "accepted", (overrides, detail)
    cfg, (task, nets, tx, loop) = detail
    loop = type(loop)(
        **{
            **loop.__dict__,
            "steps": STEPS,
            "log_every": 2,
            "eval_every": 3,
            "checkpoint_every": 0,
            "progress": "none",
            "resume": False,
        }
    )
    record = cli._train(cfg, task, nets[:1], tx, loop, [tmp_dir], tmp_dir, [{"seed": str(cfg.seed)}], None)[0]
    assert record["status"] in ("completed", "diverged"), (overrides, record)
    assert finite(record["final"].values()) and finite(record["best"].get(k) for k in record["best"] if k != "step")
    if record["status"] == "diverged":
        assert 1 <= record["diverged"]["step"] <= STEPS and record["error"].startswith("at step"), record
    else:
        assert record["final"] and record["nonfinite_steps"] <= loop.max_skipped * STEPS, (overrides, record)
    acc = events(tmp_dir)
    assert all(math.isfinite(e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)), overrides
    return record["status"]


def _fuzz(tmp_path_factory, n: int) -> Counter:
    import jax

    jax.config.update("jax_compilation_cache_dir", str(CACHE))
    seen: Counter = Counter()

    @settings(max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(dynamics())
    def prop(overrides):
        seen[run_dynamics([*BASE, *overrides], tmp_path_factory.mktemp("dyn"))] += 1

    prop()
    print(f"\ndynamics: {n} draws: {dict(seen)}")
    return seen


def test_fuzzed_dynamics_end_completed_with_finite_metrics_or_diverged(tmp_path_factory):
    """Two draws in the default suite (each compiles a model, ~15 s CPU); the slow test below takes many."""
    seen = _fuzz(tmp_path_factory, n=2)
    assert sum(seen.values()) == 2


@pytest.mark.slow  # the same cases run through the CLI in train/test_divergence.py and train/test_reliability.py
def test_huge_learning_rates_and_eps0_squared_diverge(tmp_path_factory):
    """The held-out corner cases: a huge rate under softmax, eps=0 squared attention at a huge rate."""
    for extra in (["optim.lr=1e5"], ["normalizer=squared", "normalizer.eps=0", "optim.lr=1e6"]):
        overrides = [*BASE, "task=mqar", *tiny_task("mqar"), "optim.warmup_steps=0", *extra]
        assert run_dynamics(overrides, tmp_path_factory.mktemp("held")) == "diverged", extra


@pytest.mark.slow
def test_fuzzed_dynamics_many(tmp_path_factory):
    seen = _fuzz(tmp_path_factory, n=60)
    assert seen["completed"] and seen["diverged"], seen
