"""Today's validation table, measured: each bad-input case through the real `attnlab-train` entry.

The cases are the test suite's own (tests/config/test_validation.py BAD, tests/test_fuzz.py FIXED) plus the
command-line-only ones of tests/config/test_validation.py and tests/test_cli.py. Each runs in this process
through `cli.train_main` (exit code and the `attnlab: error:` lines it prints); the module that raised
is read from the traceback of the error that the exit reports.

    JAX_PLATFORMS=cpu .venv/bin/python scripts/validation_table.py > table.md
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "config")]  # the helpers; test_validation

from cli_helpers import TINY, tiny_task  # noqa: E402
from test_fuzz import FIXED  # noqa: E402
from test_validation import BAD  # noqa: E402

from attnlab import cli  # noqa: E402

_ONE = sys.argv[1:2] == ["--one"]  # run one case and print (exit, lines, module) as JSON

# The CLI-only cases (composition errors, resume, devices, paths): inline parameters in the tests.
CLI_ONLY = [
    ["normalizer=bogus"],
    ["model.foo=1"],
    ["trainer.stepz=3"],
    ["trainer.resume=true"],
    ["trainer.batch_size=6", "accelerator.devices=4"],
    ["accelerator.platform=quantum"],
    ["hydra.run.dir={blocker}/out"],
    ["compile_cache={blocker}/cache"],
    ["normalizer=softmax", "normalizer.prior=recency"],
    ["task=lm", "task.path={short_text}", "task.seq_len=64"],
]


def cases(scratch: Path) -> list[list[str]]:
    """Every case, the CLI-only ones pointed at files made in `scratch` (a regular file, a 520-byte text)."""
    blocker, short_text = scratch / "a_file", scratch / "short.txt"
    blocker.write_text("not a directory")
    short_text.write_text("hello world. " * 40)
    return [
        *(o for o, _ in BAD),
        *([*f] for f in FIXED),
        *([o.format(blocker=blocker, short_text=short_text) for o in c] for c in CLI_ONLY),
    ]


def command_line(case: list[str], run_dir: Path) -> list[str]:
    """TINY, the task's tiny sizes and the case; a key the case sets is dropped from the base."""
    task = next((o.split("=")[1] for o in case if o.startswith("task=")), "mqar")
    keys = {o.split("=", 1)[0].lstrip("+~") for o in case} - {"task"}
    base = [o for o in [*TINY, f"task={task}", *tiny_task(task)] if o.split("=", 1)[0] not in keys]
    run = [] if "hydra.run.dir" in keys else [f"hydra.run.dir={run_dir}"]
    return [*base, *(o for o in case if not o.startswith("task=")), *run]


def in_a_fresh_process(argv: list[str]) -> tuple[int, list[str], str]:
    """As `through_the_entry`, for a case that must start JAX itself (accelerator.devices): this script, --one."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run([sys.executable, __file__, "--one", *argv], env=env, capture_output=True, text=True)
    code, lines, where = json.loads(proc.stdout.splitlines()[-1])
    return code, lines, where


def through_the_entry(argv: list[str]) -> tuple[int, list[str], str]:
    """(exit code, the `attnlab: error:` lines, the module that refused) of `attnlab-train ARGV`, in process."""
    if any(o.startswith("accelerator.devices=") for o in argv) and not _ONE:
        return in_a_fresh_process(argv)
    err = io.StringIO()
    sys.argv = ["attnlab-train", *argv]
    code, where = 0, "not refused"
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.train_main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
            where = refused_in(exc)
    return code, [line for line in err.getvalue().splitlines() if line.startswith("attnlab: error:")], where


def refused_in(exit_: SystemExit) -> str:
    """The deepest attnlab module (checks.py's message helpers aside) of the error that the exit reports.

    sys.exit is called inside the `except` that caught the error, so it is the exit's __context__;
    an exit without one (the output-directory callback) was decided where it was called.
    """
    cause = exit_.__context__ or exit_
    frames = [
        f.filename.split("/attnlab/", 1)[1]
        for f in traceback.extract_tb(cause.__traceback__)
        if "/src/attnlab/" in f.filename and not f.filename.endswith("/attnlab/checks.py")
    ]
    return frames[-1] if frames else f"hydra ({type(cause).__name__})"


def main() -> None:
    scratch = tempfile.TemporaryDirectory()
    all_cases = cases(Path(scratch.name))
    print("| case | exit | the line | raised in |\n|---|---|---|---|")
    counts = {
        "one line and exit 2": 0,
        "raised in a component": 0,
        "in cli.py": 0,
        "by Hydra's composition": 0,
        "not refused": 0,
    }
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    for i, case in enumerate(all_cases):
        argv = command_line(case, Path(scratch.name) / f"r{i}")
        code, lines, where = through_the_entry(argv)
        counts["one line and exit 2"] += code == 2 and len(lines) == 1
        counts[
            where
            if where in counts
            else "by Hydra's composition"
            if where.startswith("hydra")
            else "in cli.py"
            if where == "cli.py"
            else "raised in a component"
        ] += 1
        line = lines[0].removeprefix("attnlab: error: ") if len(lines) == 1 else f"{len(lines)} lines"
        print(f"| `{' '.join(case)}` | {code} | {line.replace('|', '∣')} | {where} |")
    wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
    print(
        f"\n{len(all_cases)} cases: "
        + ", ".join(f"{n} {what}" for what, n in counts.items())
        + f"; {wall:.0f} s wall, {cpu:.0f} s CPU"
    )
    scratch.cleanup()


if __name__ == "__main__":
    if _ONE:
        print(json.dumps(through_the_entry(sys.argv[2:])))
    else:
        main()
