"""A pytest plugin that records what each test costs: `pytest -p profile_plugin` with ATTNLAB_TEST_PROFILE=DIR.

Per test (one JSON line per test in DIR/<worker>.jsonl): wall seconds of setup, call and teardown, this process's
CPU seconds, the CPU seconds of the child processes it waited for, the subprocesses it started, and XLA's backend
compiles in this process (count and seconds, from jax.monitoring's compile-duration event, which a persistent-cache
hit does not record), and the seconds spent tracing and lowering programs. Per fixture setup: its name, scope and
wall seconds. `scripts/test_profile.py` sums them.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from pathlib import Path

import pytest

OUT = os.environ.get("ATTNLAB_TEST_PROFILE")
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# Tracing to a jaxpr and lowering it to MLIR: paid on every compile, a persistent-cache hit included.
TRACE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")


class Meter:
    """Counters since the current test began."""

    def __init__(self):
        self.compiles, self.compile_s, self.trace_s, self.spawned = 0, 0.0, 0.0, 0

    def on_duration(self, event: str, seconds: float, **_):
        if event == COMPILE_EVENT:
            self.compiles += 1
            self.compile_s += seconds
        elif event in TRACE_EVENTS:
            self.trace_s += seconds


METER = Meter()
RECORDS: list[dict] = []
FIXTURES: list[dict] = []


def cpu_seconds(who) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def pytest_configure(config):
    if not OUT:
        return
    import jax

    jax.monitoring.register_event_duration_secs_listener(METER.on_duration)
    popen_init = subprocess.Popen.__init__

    def counting_init(self, *args, **kwargs):
        METER.spawned += 1
        popen_init(self, *args, **kwargs)

    subprocess.Popen.__init__ = counting_init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not OUT:
        yield
        return
    METER.__init__()
    start = (time.perf_counter(), cpu_seconds(resource.RUSAGE_SELF), cpu_seconds(resource.RUSAGE_CHILDREN))
    yield
    RECORDS.append(
        {
            "test": item.nodeid,
            "wall_s": time.perf_counter() - start[0],
            "cpu_s": cpu_seconds(resource.RUSAGE_SELF) - start[1],
            "child_cpu_s": cpu_seconds(resource.RUSAGE_CHILDREN) - start[2],
            "compiles": METER.compiles,
            "compile_s": METER.compile_s,
            "trace_s": METER.trace_s,
            "subprocesses": METER.spawned,
        }
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if not OUT:
        yield
        return
    start = time.perf_counter()
    yield
    FIXTURES.append(
        {
            "fixture": f"{fixturedef.baseid or '.'}::{fixturedef.argname}",
            "scope": fixturedef.scope,
            "test": request.node.nodeid,
            "wall_s": time.perf_counter() - start,
        }
    )


def pytest_sessionfinish(session):
    if not OUT:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    out = Path(OUT)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{worker}.jsonl", "w") as f:
        for record in RECORDS:
            f.write(json.dumps({"kind": "test", **record}) + "\n")
        for record in FIXTURES:
            f.write(json.dumps({"kind": "fixture", **record}) + "\n")
