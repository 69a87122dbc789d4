"""scripts/test_profile.py: the suite's CPU floor and its costliest test functions, on records summed by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import test_profile as tp  # noqa: E402


def _test(nodeid, wall, cpu, child, compiles):
    """A record as tests/profile_plugin.py writes one (no compile or trace seconds, no subprocess)."""
    return {
        "kind": "test",
        "test": nodeid,
        "wall_s": wall,
        "cpu_s": cpu,
        "child_cpu_s": child,
        "compiles": compiles,
        "compile_s": 0.0,
        "trace_s": 0.0,
        "subprocesses": 0,
    }


def test_the_cpu_floor_and_the_test_functions_are_summed_over_workers_and_parametrizations(tmp_path):
    records = {
        "gw0": [
            _test("tests/a/test_x.py::test_f[1]", 4.0, 3.0, 0.4, 10),
            _test("tests/b.py::test_g", 9.0, 1.0, 6.0, 0),
        ],
        "gw1": [_test("tests/a/test_x.py::test_f[2]", 6.0, 5.0, 0.0, 20)],
    }
    for worker, lines in records.items():
        (tmp_path / f"{worker}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tp.report(tmp_path).splitlines()
    # workers' CPU 3 + 1 + 5 = 9 s, children's 0.4 + 6 = 6.4 s: 15.4 s on 2 cores is at least 7.7 s of wall time
    assert out[1] == (
        "CPU: 9 s in the workers + 6 s in their child processes = 15 s, "
        "at least 8 s of wall time on 2 cores (budget 360 s)"
    )
    assert tp.by_function(tp.load(tmp_path)[0]) == [
        ("tests/a/test_x.py::test_f", 2, 10.0, 30),
        ("tests/b.py::test_g", 1, 9.0, 0),
    ]
