#!/usr/bin/env python
"""Training-step benchmark: today's step vs the step at a base commit vs a hand-written JAX step.

Protocol and results: BENCHMARKS.md, "Training step". One command, a few minutes on 2 cores:

    JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_train.py [--base f7084a9] [--rounds 9] [--block 20]
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from bench_common import clock, interleave, med, paired_ratio, since, table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASE = "f7084a9"  # the step BENCHMARKS.md compares the current train step against


# ---------------------------------------------------------------------------------------------
# worker: one compiled step in its own process, driven over stdin/stdout


def compiled_default_step():
    """(compiled plain step, state, data, net, cfg, loop) exactly as `attnlab.train.fit` builds them for
    the default experiment; fit is stopped by its `on_compiled` hook once the steps are compiled."""
    import hydra

    import attnlab.train as train
    from attnlab.accelerator import data_mesh
    from attnlab.config import registry
    from attnlab.config.assembly import assemble

    with hydra.initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        cfg = hydra.compose("train", overrides=[])
    task, nets, tx, loop = assemble(cfg, cfg.task.default_head)
    got = {}

    class Stop(Exception):
        pass

    def capture(steps, state, data):
        got["step"], got["state"], got["data"] = steps.plain, state, data
        raise Stop

    hook = {"on_compiled": capture}
    if "on_compiled" not in inspect.signature(train.fit).parameters:  # a --base commit whose fit has no hook
        hook, real = {}, train.make_train_step

        def make(*args, **kwargs):  # those commits compile train.make_train_step's result inside fit
            jitted = real(*args, **kwargs)
            return types.SimpleNamespace(
                lower=lambda state, data: capture(
                    types.SimpleNamespace(plain=jitted.lower(state, data).compile()), state, data
                )
            )

        train.make_train_step = make
    with tempfile.TemporaryDirectory() as tmp:
        try:
            train.fit(nets, task, tx, loop, mesh=data_mesh(), run_dirs=[Path(tmp)], checkpoint_dir=Path(tmp), **hook)
        except Stop:
            pass
    return got["step"], got["state"], got["data"], nets[0], cfg, loop


def worker(kind: str) -> None:
    import jax

    step, state, data, net, cfg, loop = compiled_default_step()
    if kind.startswith("hand"):
        import minimal_step

        step, state = minimal_step.compiled(net, cfg, loop, data, fast=kind == "hand_fast")
    losses = []
    for _ in range(3):  # same numbers: the first steps' losses, compared across workers
        state, m = step(state, data)
        losses.append(float(jax.numpy.ravel(m["loss"] if isinstance(m, dict) else m)[0]))
    print(json.dumps({"ready": kind, "losses": losses}), flush=True)
    for line in sys.stdin:
        n = int(line)
        start = clock()
        for _ in range(n):
            state, _ = step(state, data)
        jax.block_until_ready(state)
        wall, cpu = since(start)
        print(json.dumps({"ms": wall / n * 1e3, "cpu_ms": cpu / n * 1e3}), flush=True)


# ---------------------------------------------------------------------------------------------
# driver


def source_tree(rev: str | None, dest: str) -> str:
    """The src/ directory of commit `rev` (None: the working tree) copied into dest, importable from PYTHONPATH.

    configs/ has sat beside src/ (read from there), inside the package, and at the top mapped into the package as
    attnlab.configs by the build (pyproject's package-dir): a top-level configs/ is kept and also copied into the
    package, so each layout finds it where its code looks."""
    os.makedirs(dest)
    if rev is None:
        shutil.copytree(ROOT / "src", os.path.join(dest, "src"))
        shutil.copytree(ROOT / "configs", os.path.join(dest, "configs"))
    else:
        top = subprocess.run(
            ["git", "-C", str(ROOT), "ls-tree", "--name-only", rev], check=True, capture_output=True, text=True
        ).stdout.split()
        paths = ["src", *(["configs"] if "configs" in top else [])]
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, *paths], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    packaged = os.path.join(dest, "src", "attnlab", "configs")
    if os.path.isdir(os.path.join(dest, "configs")) and not os.path.isdir(packaged):
        shutil.copytree(os.path.join(dest, "configs"), packaged)
    if os.path.isdir(packaged):  # a regular package: a namespace one would merge with the installed attnlab.configs
        Path(packaged, "__init__.py").touch()
    return os.path.join(dest, "src")


def spawn(kind: str, src: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(ROOT / "scripts")]), "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", kind], env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )


def default_run(src: str, steps: int, tmp: str, name: str, extra: tuple[str, ...] = ()) -> dict:
    """`python -m attnlab` with the defaults (trainer.steps and `extra` aside) under `src`; its metrics.json."""
    run_dir = os.path.join(tmp, name)
    env = {**os.environ, "PYTHONPATH": src, "JAX_PLATFORMS": "cpu"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab",
            f"trainer.steps={steps}",
            "trainer.progress=none",
            "compile_cache=null",
            f"hydra.run.dir={run_dir}",
            *extra,
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    return json.loads(Path(run_dir, "metrics.json").read_text())


def timed_block(p: subprocess.Popen, steps: int) -> dict:
    """Ask a worker to time `steps` consecutive steps; its {ms, cpu_ms} per step."""
    p.stdin.write(f"{steps}\n")
    p.stdin.flush()
    return reply(p)


def reply(p: subprocess.Popen) -> dict:
    """The worker's next JSON line (anything else it prints, e.g. fit's own messages, is skipped)."""
    while True:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"a benchmark worker ended early (exit {p.wait()})")
        if line.startswith("{"):
            return json.loads(line)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=DEFAULT_BASE, help="the commit whose step is 'old'")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--block", type=int, default=20, help="consecutive steps per timed block")
    ap.add_argument("--fit-steps", type=int, default=800, help="trainer.steps of the default runs (0: skip them)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    t_start, load_start = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {
            "old": source_tree(args.base, os.path.join(tmp, "old")),
            "new": source_tree(None, os.path.join(tmp, "new")),
        }
        kinds = {"old": "attnlab", "new": "attnlab", "hand_autodiff": "hand_autodiff", "hand_fast": "hand_fast"}
        procs = {name: spawn(kind, srcs.get(name, srcs["new"])) for name, kind in kinds.items()}
        ready = {name: reply(p) for name, p in procs.items()}
        names = list(procs)
        samples = interleave({n: functools.partial(timed_block, procs[n], args.block) for n in names}, args.rounds)
        ms = {n: [s["ms"] for s in samples[n]] for n in names}
        cpu = {n: [s["cpu_ms"] for s in samples[n]] for n in names}
        for p in procs.values():
            p.stdin.close()
            p.wait()
        fit = {}
        if args.fit_steps:
            for name in ("old", "new"):
                fit[name] = default_run(srcs[name], args.fit_steps, tmp, name)
    load_end = os.getloadavg()

    print(
        f"base {args.base}; {args.rounds} rounds × {args.block} steps per variant; "
        f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end; {os.cpu_count()} CPUs; "
        f"{time.perf_counter() - t_start:.0f} s in all\n"
    )
    print(
        "\n".join(
            table(
                ["step", "ms/step (median)", "CPU ms/step (median)", "first 3 losses"],
                [
                    [n, f"{med(ms[n]):.2f}", f"{med(cpu[n]):.2f}", ", ".join(f"{x:.5f}" for x in ready[n]["losses"])]
                    for n in names
                ],
            )
        )
    )
    pairs = [
        ("old / new (speed-up)", "old", "new"),
        ("new / hand_fast (the limit)", "new", "hand_fast"),
        ("hand_autodiff / hand_fast", "hand_autodiff", "hand_fast"),
    ]
    print()
    print(
        "\n".join(
            table(
                ["ratio", "wall", "CPU"],
                [[label, paired_ratio(ms[a], ms[b]), paired_ratio(cpu[a], cpu[b])] for label, a, b in pairs],
            )
        )
    )
    if fit:
        print(
            f"\ndefault run (trainer.steps={args.fit_steps}) steps_per_sec: old {fit['old']['steps_per_sec']:.2f}, "
            f"new {fit['new']['steps_per_sec']:.2f}, "
            f"ratio {fit['new']['steps_per_sec'] / fit['old']['steps_per_sec']:.2f}; "
            f"final test/loss old {fit['old']['final']['test/loss']:.4f}, new {fit['new']['final']['test/loss']:.4f}"
        )


if __name__ == "__main__":
    main()
