#!/usr/bin/env python
"""attnlab's train steps as XLA:GPU programs, compiled without a GPU: what each one launches and moves.

A deviceless compile, not a measurement of time. The CUDA plugin (`pip install 'jax[cuda12]==<the installed
jax>'`; `make test-gpu-program` builds such an environment) compiles for a GPU described by a target config
(gpu_targets/*.txtpb) with no driver or device; JAX_PLATFORMS=cpu stays set. The plain and logging steps are
built as a run builds them (assembly.assemble, the run's matmul precision, train.train_data, train.loop.compile_steps),
the hand-written reference step is scripts/bench_gpu.py's. Per program:

  custom calls   cuDNN flash attention forward/backward (__cudnn$fmha...), cuBLAS GEMMs, ...
  T×T buffers    outputs of top-level instructions with two dimensions equal to T (materialised scores)
  kernels        kernel-launching instructions outside fusions, loop bodies times their trip counts
  GFLOP, GB      XLA's HLO cost analysis of the optimized module (flops, bytes accessed), each loop body
                 counted per trip, and a labelled model for cuDNN's attention calls (fmha_cost)
  peak MiB       XLA's memory analysis (temp + arguments + outputs − aliased)

Reliable without a GPU: the attention path, T×T buffers, kernel counts, bytes and peak memory. Not here:
autotuning, cuDNN's graph build (a configuration cuDNN has no engine for fails on the GPU only), any time.

    JAX_PLATFORMS=cpu python scripts/gpu_program.py [--target h100] [--shapes 32x1024,4x8192] [--write]
        [--diff-kernels]   (then each plain step's kernels less the reference's, by kind and shape)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import os
import re
import sys
import traceback
from collections import Counter
from pathlib import Path
from unittest import mock

# XLA's CUB sort rewriter asks the CUDA runtime for a radix sort's scratch size while it compiles, which fails with no
# device ("cudaErrorInvalidDevice: invalid device ordinal"); the deviceless compile sorts with XLA's own sort kernel.
# The logging step sorts (the residual stream's median |x|, for massive_ratio); a run on a GPU keeps CUB. Read when
# XLA starts: set here before jax is imported for the script, and by `make test-gpu-program` for pytest.
DEVICELESS_XLA_FLAGS = "--xla_gpu_enable_cub_radix_sort=false"
if DEVICELESS_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {DEVICELESS_XLA_FLAGS}".strip()

import jax  # noqa: E402 — after XLA_FLAGS
import numpy as np  # noqa: E402
from bench_common import mib, peak_bytes, table, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"h100": "h100_sxm.txtpb", "a100": "a100_sxm_80.txtpb"}
TARGET_DIR = Path(__file__).resolve().parent / "gpu_targets"
SECTION = "## GPU program, deviceless (scripts/gpu_program.py)"
REFERENCE = "hand-written reference"
# Instructions that launch no kernel: buffer plumbing, control flow (its computations are counted instead).
HEADER = """\
Deviceless XLA:GPU compile for {target} (scripts/gpu_targets/{file}), JAX {jax}, by `{cmd}`
(JAX_PLATFORMS=cpu, the CUDA plugin installed): **not a measurement of time**, no GPU ran anything.
model=base task=lm bfloat16, each program built as `attnlab-train` builds it. Columns: the attention path
the run picks; cuDNN attention calls (flash or not, mask type); instructions with a T×T output; kernels
launched per step (instructions outside fusions, loop bodies × trip counts; "≥": a loop whose trip count
depends on an outer loop, the causal key blocks, counted once per outer step); GFLOP and GB accessed by
XLA's HLO cost analysis of the optimized module with each loop body counted per trip, plus a model for
the cuDNN attention calls the analysis cannot see (4·B·N·T·S·H FLOPs forward, halved when causal, 2.5×
backward; bytes: their operands and results); XLA's peak memory. Ratios: a plain step to the hand-written
reference (of one seed, also for vmapped seeds); a logging step (statistics program, then the plain
step; peak: the larger) to its plain step. FAILED rows: the program did not compile, with the error."""
NO_KERNEL = {
    "parameter",
    "constant",
    "tuple",
    "get-tuple-element",
    "bitcast",
    "while",
    "conditional",
    "call",
    "after-all",
    "add-dependency",
    "opt-barrier",
    "partition-id",
    "replica-id",
    "domain",
}


# --- the target -------------------------------------------------------------------------------


def target_config(name: str) -> str:
    """The GpuTargetConfigProto text of a target (gpu_targets/<file>, openxla/xla's spec, trimmed)."""
    if name not in TARGETS:
        raise SystemExit(f"gpu_program: unknown target {name!r}; allowed: {', '.join(TARGETS)}")
    return (TARGET_DIR / TARGETS[name]).read_text()


def compute_capability(config: str) -> tuple[int, int]:
    """(major, minor) of the target's cuda_compute_capability."""
    block = re.search(r"cuda_compute_capability\s*\{([^}]*)\}", config).group(1)
    field = lambda f: int(m.group(1)) if (m := re.search(rf"{f}:\s*(\d+)", block)) else 0  # noqa: E731
    return field("major"), field("minor")


def check_plugin() -> None:
    """Exit with the install command when the CUDA plugin is missing (it is what compiles for the GPU)."""
    import importlib.util

    if not any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13)):
        raise SystemExit(
            f"gpu_program: needs the CUDA plugin of the installed jax: pip install "
            f"'jax[cuda12]=={jax.__version__}' (or `make test-gpu-program`)"
        )


@contextlib.contextmanager
def on_target(name: str):
    """A one-device mesh of the target's compile-only topology; inside, traced code sees a GPU of its compute
    capability: attnlab's platform checks (jax.default_backend) and jax's cuDNN checks, which otherwise
    ask the (absent) device and answer pre-Hopper."""
    from jax._src.cudnn import fused_attention_stablehlo as fa
    from jax.experimental import topologies

    check_plugin()
    config = target_config(name)
    topo = topologies.get_topology_desc(platform="cuda", topology_name=name, target_config=config, topology="1x1x1")
    mesh = topologies.make_mesh(topo, (1,), ("data",))
    cc = compute_capability(config)
    parse = lambda c: tuple(int(x) for x in c.split("."))  # noqa: E731
    with (
        mock.patch.object(jax, "default_backend", lambda: "gpu"),
        mock.patch.object(fa, "check_compute_capability", lambda c: cc >= parse(c)),
        mock.patch.object(fa, "is_cuda_compute_capability_equal", lambda c: cc == parse(c)),
    ):
        yield mesh


# --- the programs -------------------------------------------------------------------------------


def run_overrides(model: str, B: int, T: int, normalizer: str, seeds: int, extra: tuple = ()) -> list[str]:
    """A run's overrides (on a GPU's defaults: accelerator=gpu, bfloat16)."""
    return [
        "accelerator=gpu",
        f"model={model}",
        "task=lm",
        f"task.seq_len={T}",
        f"trainer.batch_size={B}",
        f"normalizer={normalizer}",
        f"trainer.vmap_seeds={seeds}",
        "task.n_train=64",
        "task.n_val=8",
        "task.n_test=8",
        *extra,
    ]


def attnlab_programs(mesh, overrides: list[str]) -> dict:
    """{"plain", "stats", "impl"}: the compiled train step and statistics program of `attnlab-train
    <overrides>` for the target (scripts/bench_gpu.py builds them as a run does)."""
    import bench_gpu

    run = bench_gpu.attnlab_run(overrides, mesh)
    return {"plain": run["steps"].train_program, "stats": run["statistics"], "impl": sorted(set(run["impl"]))}


def reference_program(mesh, B: int, T: int, overrides: list[str], same_math: bool = False):
    """scripts/bench_gpu.py's hand-written step (cuDNN attention) with the sizes of the run's model; `same_math`:
    with attnlab's β and gradient clipping (bench_gpu.handwritten)."""
    import bench_gpu

    dims = bench_gpu.reference_dims(bench_gpu.compose(overrides))
    step, state, data, _ = bench_gpu.handwritten(B, T, **dims, same_math=same_math)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return step.lower(bench_gpu.abstract(state, sharding), bench_gpu.abstract(data, sharding)).compile()


# --- reading the optimized HLO -----------------------------------------------------------------


@dataclasses.dataclass
class Instruction:
    name: str
    shape: str
    opcode: str
    attrs: str


def hlo_computations(text: str) -> tuple[dict[str, list[Instruction]], dict[str, list[str]], str]:
    """({computation: instructions}, {computation: its lines}, entry name) of an HLO module's text."""
    comps, blocks, entry, current = {}, {}, None, None
    for line in text.splitlines():
        head = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            current = head.group(2)
            comps[current], blocks[current] = [], [line.removeprefix("ENTRY ")]
            entry = current if head.group(1) else entry
        elif current is not None:
            blocks[current].append(line)
            if line.startswith("}"):
                current = None
            elif " = " in line:
                comps[current].append(parse_instruction(line))
    return comps, blocks, entry


def parse_instruction(line: str) -> Instruction:
    """name, result shape, opcode and the text after the operands of one HLO instruction line."""
    name, rest = line.strip().removeprefix("ROOT ").split(" = ", 1)
    if rest.startswith("("):  # a tuple shape: up to its matching parenthesis
        depths = itertools.accumulate({"(": 1, ")": -1}.get(ch, 0) for ch in rest)
        end = next(i for i, depth in enumerate(depths, 1) if depth == 0)
        shape, rest = rest[:end], rest[end:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    opcode, _, attrs = rest.partition("(")
    return Instruction(name.lstrip("%"), shape, opcode, attrs)


def called(ins: Instruction, key: str) -> list[str]:
    """The computations an instruction names under `key` (body=, condition=, to_apply=, branch_computations=)."""
    m = re.search(rf"\b{key}=\{{?([%\w.\-, ]+)\}}?", ins.attrs)
    return [c.strip().lstrip("%") for c in m.group(1).split(",")] if m else []


def trip_count(ins: Instruction) -> int | None:
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"', ins.attrs)
    return int(m.group(1)) if m else None


def control_children(ins: Instruction) -> list[tuple[str, int]]:
    """(computation, runs per run of `ins`) that a control-flow instruction runs: a loop's body n times and
    its condition n + 1 (n: XLA's known trip count, else 1), a call's computation once; a conditional,
    each branch once (an upper bound: one runs)."""
    if ins.opcode == "while":
        n = trip_count(ins) or 1
        return [(called(ins, "body")[0], n), (called(ins, "condition")[0], n + 1)]
    if ins.opcode == "call":
        return [(called(ins, "to_apply")[0], 1)]
    if ins.opcode == "conditional":
        branches = called(ins, "branch_computations") or called(ins, "true_computation") + called(
            ins, "false_computation"
        )
        return [(b, 1) for b in branches]
    return []


def executed(comps: dict, entry: str) -> list[tuple[str, Instruction | None, int]]:
    """(computation, instruction, times per step) for every instruction outside fusions, and (computation,
    None, times) once per run of a computation: loop bodies × trip counts (control_children)."""

    def walk(name: str, times: int):
        yield name, None, times
        for ins in comps[name]:
            yield name, ins, times
            for child, n in control_children(ins):
                yield from walk(child, times * n)

    return list(walk(entry, 1))


def array_dims(shape: str) -> list[tuple[str, list[int]]]:
    """(dtype, dims) of each array in a (tuple) shape string such as (f32[8,1024]{1,0}, s32[])."""
    return [(t, [int(d) for d in dims.split(",") if d]) for t, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape)]


DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
}


@dataclasses.dataclass
class Program:
    """What one compiled program launches, moves and holds."""

    kernels: int
    unknown_trips: int  # loops whose trip count XLA does not know (it depends on an outer loop): counted once
    custom_calls: Counter
    fmha: set  # (is_flash_attention, mask_type) of each cuDNN attention call
    txt_buffers: int  # top-level instructions with a T×T array among their outputs
    txt_largest: int  # bytes of the largest such array
    gflop: float | None
    gbytes: float | None
    peak: int | None
    kinds: Counter = dataclasses.field(default_factory=Counter)  # kernel_kind -> launches per step

    @classmethod
    def of(cls, compiled, T: int) -> "Program":
        text = compiled.as_text()
        comps, blocks, entry = hlo_computations(text)
        runs = executed(comps, entry)
        loops = LoopCost(text, comps, blocks, entry)
        calls, fmha, txt, cost = Counter(), set(), [], np.zeros(2)
        for comp, ins, times in runs:
            if ins is None:
                cost += times * loops.own(comp)
                continue
            if ins.opcode == "custom-call":
                target = re.search(r'custom_call_target="([^"]+)"', ins.attrs).group(1)
                calls[target] += times
                if target.startswith("__cudnn$fmha"):
                    flash = re.search(r'"is_flash_attention":\s*(\w+)', ins.attrs)
                    mask = re.search(r'"mask_type":\s*"(\w+)"', ins.attrs)
                    fmha.add((flash is not None and flash.group(1) == "true", mask.group(1) if mask else "?"))
                    cost += times * fmha_cost(ins)
            if ins.opcode not in ("bitcast", "get-tuple-element", "tuple"):
                txt += [np.prod(d) * DTYPE_BYTES.get(t, 4) for t, d in array_dims(ins.shape) if d.count(T) >= 2]
        unknown = sum(1 for _, ins, _ in runs if ins is not None and ins.opcode == "while" and trip_count(ins) is None)
        kinds = Counter()
        for _, ins, times in runs:
            if ins is not None and ins.opcode not in NO_KERNEL:
                kinds[kernel_kind(ins, comps)] += times
        return cls(
            kernels=sum(t for _, ins, t in runs if ins is not None and ins.opcode not in NO_KERNEL),
            unknown_trips=unknown,
            custom_calls=calls,
            fmha=fmha,
            txt_buffers=len(txt),
            txt_largest=int(max(txt, default=0)),
            gflop=cost[0] / 1e9,
            gbytes=cost[1] / 1e9,
            peak=peak_bytes(compiled),
            kinds=kinds,
        )

    def attention_calls(self) -> str:
        names = {k.removeprefix("__cudnn$"): v for k, v in self.custom_calls.items() if k.startswith("__cudnn$fmha")}
        kinds = ", ".join(("flash " if flash else "not flash ") + mask for flash, mask in sorted(self.fmha))
        return (", ".join(f"{k}×{v}" for k, v in sorted(names.items())) + f" ({kinds})") if names else "none"

    def __add__(self, other: "Program") -> "Program":
        """The logging step: the statistics program, then the plain step."""
        add = lambda a, b: None if a is None or b is None else a + b  # noqa: E731
        return Program(
            self.kernels + other.kernels,
            self.unknown_trips + other.unknown_trips,
            self.custom_calls + other.custom_calls,
            self.fmha | other.fmha,
            self.txt_buffers + other.txt_buffers,
            max(self.txt_largest, other.txt_largest),
            add(self.gflop, other.gflop),
            add(self.gbytes, other.gbytes),
            None if self.peak is None or other.peak is None else max(self.peak, other.peak),
            self.kinds + other.kinds,
        )


def kernel_kind(ins: Instruction, comps: dict) -> str:
    """What a kernel is, to compare two programs: a fusion's kind and root opcode, a custom call's target, or
    the opcode; then its result shape (e.g. `fusion kLoop:add f32[512]`)."""
    kind = ins.opcode
    if ins.opcode == "fusion":
        fused = re.search(r"kind=(\w+)", ins.attrs)
        body = comps.get(next(iter(called(ins, "calls")), ""), [])
        kind += f" {fused.group(1) if fused else '?'}:{body[-1].opcode if body else '?'}"
    elif ins.opcode == "custom-call":
        kind += " " + re.search(r'custom_call_target="([^"]+)"', ins.attrs).group(1)
    layoutless = re.sub(r"\{[^}]*\}", "", ins.shape)  # f32[512]{0} -> f32[512]
    return f"{kind} {layoutless}"


def kernel_diff(prog: "Program", ref: "Program") -> list[str]:
    """Lines `+n kind` / `-n kind`: the kernels one program launches more or fewer times than another."""
    diff = Counter(prog.kinds)
    diff.subtract(ref.kinds)
    return [f"{n:+5d}  {kind}" for kind, n in sorted(diff.items(), key=lambda kv: (-kv[1], kv[0])) if n]


def xla_cost(text: str) -> np.ndarray:
    """[flops, bytes accessed] by XLA's HLO cost analysis of a module's text (the CPU client's analysis,
    which reads any backend's HLO); a cuDNN custom call, unknown to it, counts about nothing."""
    import jaxlib._hlo as hlo
    from jax._src import xla_bridge
    from jax._src.lib import _jax

    cost = _jax.hlo_module_cost_analysis(xla_bridge.get_backend("cpu"), hlo.hlo_module_from_text(text))
    return np.array([cost.get("flops", 0.0), cost.get("bytes accessed", 0.0)])


class LoopCost:
    """XLA's HLO cost analysis with each loop body counted once per trip (on a whole module it counts a body
    once): each computation the program runs is analysed as the entry of a module of its own, and its own
    cost is that less the computations it runs (control_children)."""

    def __init__(self, text: str, comps: dict, blocks: dict, entry: str):
        self.text, self.comps, self.blocks, self.entry = text, comps, blocks, entry
        self.cache: dict[str, np.ndarray] = {}

    def rooted(self, name: str) -> np.ndarray:
        """The analysis of a module whose entry is `name`: what it runs counted once each."""
        if name not in self.cache:
            self.cache[name] = xla_cost(self.text if name == self.entry else self.module_of(name))
        return self.cache[name]

    def module_of(self, name: str) -> str:
        """`name` as the entry of a module holding the computations it calls, in their original order."""
        need, todo = set(), [name]
        while todo:
            for ref in re.findall(r"%([\w.\-]+)", "\n".join(self.blocks[todo.pop()][1:])):
                if ref in self.blocks and ref not in need and ref != name:
                    need.add(ref)
                    todo.append(ref)
        parts = ["\n".join(self.blocks[c]) for c in self.blocks if c in need]
        return "HloModule part\n\n" + "\n\n".join(parts + ["ENTRY " + "\n".join(self.blocks[name])]) + "\n"

    def own(self, name: str) -> np.ndarray:
        children = [c for ins in self.comps[name] for c, _ in control_children(ins)]
        return self.rooted(name) - sum((self.rooted(c) for c in children), np.zeros(2))


def braced(attrs: str, key: str) -> str:
    """The text of `key={...}` in an instruction's attributes, nested braces (layouts) included."""
    start = attrs.index(key + "{") + len(key)
    depth = 0
    for i in range(start, len(attrs)):
        depth += {"{": 1, "}": -1}.get(attrs[i], 0)
        if depth == 0:
            return attrs[start + 1 : i]
    raise ValueError(f"unbalanced {key} in an HLO instruction")


def fmha_cost(ins: Instruction) -> np.ndarray:
    """[flops, bytes] of a cuDNN attention call, a model: 4·B·N·T·S·H matmul FLOPs forward (halved when
    causal), 2.5× that backward (FlashAttention-2's count, Dao 2023); bytes: its operands and results."""
    operands = array_dims(braced(ins.attrs, "operand_layout_constraints="))
    (_, q), (_, k) = operands[0], operands[1]  # (B, T, N, H) and (B, S, N, H)
    flops = 4 * q[0] * q[2] * q[1] * k[1] * q[3] * (0.5 if "CAUSAL" in ins.attrs else 1.0)
    flops *= 2.5 if "Backward" in ins.attrs.split("custom_call_target=")[1][:40] else 1.0
    nbytes = sum(np.prod(d) * DTYPE_BYTES.get(t, 4) for t, d in operands + array_dims(ins.shape))
    return np.array([flops, nbytes])


# --- the table ---------------------------------------------------------------------------------


def compile_row(label: str, build) -> tuple[str, Program | None, Program | None, str]:
    """(label, plain, logging, impl or the failure): one failure is a row, not the end of the table."""
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - e.g. a lowering rule that cannot batch: reported per program
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return (
            label,
            None,
            None,
            f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:120]} "
            f"({Path(last.filename).name}:{last.lineno})",
        )


def rows_for(
    target: str,
    B: int,
    T: int,
    normalizers: list[str],
    seeds: list[int],
    model: str,
    extra: tuple = (),
    same_math: bool = False,
) -> list:
    """(label, plain, logging, impl) for the reference and each normalizer × seed count at B, T."""
    import bench_gpu

    out = []
    with on_target(target) as mesh:
        ref = reference_program(mesh, B, T, run_overrides(model, B, T, "softmax", 1, extra), same_math)
        out.append((REFERENCE + (bench_gpu.SAME_MATH if same_math else ""), Program.of(ref, T), None, "cudnn"))
        for name in normalizers:
            for S in seeds:
                label = f"{name}" + (f" vmap_seeds={S}" if S > 1 else "")

                overrides = run_overrides(model, B, T, name, S, extra)

                def build(label=label, overrides=overrides):
                    p = attnlab_programs(mesh, overrides)
                    plain = Program.of(p["plain"], T)
                    return label, plain, Program.of(p["stats"], T) + plain, "/".join(p["impl"])

                out.append(compile_row(label, build))
                print(f"  B={B} T={T} {out[-1][0]}: {out[-1][3]}", file=sys.stderr, flush=True)
    return out


def ratio(a, b) -> str:
    return "–" if a is None or not b else f"{a / b:.2f}×"


def gb(x) -> str:
    return "–" if x is None else f"{x:,.1f}"


def table_lines(target: str, B: int, T: int, rows: list) -> list[str]:
    """The Markdown table of one shape: each program, and its ratios to the reference (plain) or plain (logging)."""
    ref = next((p for label, p, _, _ in rows if label.startswith(REFERENCE)), None)
    out = []
    for label, plain, logging, impl in rows:
        if plain is None:
            out.append([f"B={B} T={T}", label, "plain", impl] + ["—"] * 7)
            continue
        for kind, prog, base in (("plain", plain, ref), ("logging", logging, plain)):
            if prog is None:
                continue
            buffers = "0" if not prog.txt_buffers else f"{prog.txt_buffers} (largest {mib(prog.txt_largest)} MiB)"
            kernels = ("≥ " if prog.unknown_trips else "") + f"{prog.kernels:,}"
            out.append(
                [
                    f"B={B} T={T}",
                    label,
                    kind,
                    impl,
                    prog.attention_calls(),
                    buffers,
                    kernels,
                    gb(prog.gflop),
                    gb(prog.gbytes),
                    mib(prog.peak),
                    f"{ratio(prog.kernels, base and base.kernels)} / {ratio(prog.gbytes, base and base.gbytes)} / "
                    f"{ratio(prog.peak, base and base.peak)}"
                    if base is not None and base is not prog
                    else "—",
                ]
            )
    return table(
        [
            "shape",
            "step",
            "program",
            "attention",
            "cuDNN fmha calls",
            "T×T buffers",
            "kernels/step",
            "GFLOP",
            "GB accessed",
            "peak MiB",
            "ratio kernels / bytes / peak",
        ],
        out,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="h100", choices=sorted(TARGETS))
    p.add_argument("--shapes", default="32x1024,4x8192", help="BxT, comma-separated")
    p.add_argument("--normalizers", default="all", help="comma-separated names, or all")
    p.add_argument("--seeds", default="1,2", help="trainer.vmap_seeds values, comma-separated")
    p.add_argument("--model", default="base", help="model config (the reference takes its sizes)")
    p.add_argument("--override", action="append", default=[], help="a further attnlab-train override (repeatable)")
    p.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    p.add_argument(
        "--diff-kernels",
        action="store_true",
        help="after the tables, each plain step's kernels less the reference's, by kind and shape",
    )
    p.add_argument(
        "--same-math-reference",
        action="store_true",
        help="the reference with attnlab's learned β and gradient clipping (what the ratios are then against)",
    )
    args = p.parse_args(argv)
    check_plugin()
    from attnlab.config import registry

    names = registry.choices("normalizer") if args.normalizers == "all" else args.normalizers.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    lines = [
        SECTION,
        "",
        *HEADER.format(
            target=args.target,
            file=TARGETS[args.target],
            jax=jax.__version__,
            cmd=" ".join(["python scripts/gpu_program.py", *(argv or sys.argv[1:])]),
        ).splitlines(),
        "",
    ]
    diffs = []
    for shape in args.shapes.split(","):
        B, T = (int(x) for x in shape.lower().split("x"))
        rows = rows_for(args.target, B, T, names, seeds, args.model, tuple(args.override), args.same_math_reference)
        lines += table_lines(args.target, B, T, rows) + [""]
        for label, plain, _, _ in rows[1:] if args.diff_kernels else []:
            if plain is not None:
                diffs += [f"B={B} T={T} {label}, plain step less the reference:", *kernel_diff(plain, rows[0][1]), ""]
    print("\n".join(lines + diffs))
    if args.write:
        write_section("\n".join(lines), ROOT / "BENCHMARKS.md", (SECTION,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
