#!/usr/bin/env python
"""attnlab's compiled train step against a hand-written JAX step of the same model on a GPU.

model=base (d 512, 8 heads, 8 layers, RoPE), task=lm, bfloat16 compute, at B=32 T=1024 (every
normalizer) and B=4 T=8192 (softmax, or every normalizer with --long-all). The attnlab steps are what
`attnlab-train` runs: built by assembly.assemble, with the run's matmul precision, drawing each step's batch from
the lm text stream on device (train.train_data), compiled by train.loop.compile_steps. Per row: ms per
step (the median of --steps calls after two warm-up calls), MFU = (6·params + 12·L·T·d)·tokens/s /
--peak-tflops (989: H100 SXM bf16 dense), XLA's compiled peak memory, and the logging step (statistics
program + train step, as the loop runs it). The hand-written step: plain jnp, float32 parameters cast to
bfloat16, jax.nn.dot_product_attention(implementation='cudnn', is_causal=True), optax AdamW, fixed
random batches. Also attnlab softmax in float32 (the goal: bf16 faster). With --profile DIR, a trace of
--profile-steps steps of the reference and of each attnlab bfloat16 softmax step (jax.profiler, read back with
its ProfileData): per step the host's wall ms, the device's busy ms (the union of its kernel and copy
intervals), kernels launched, and the kernels that took the most time; wall minus busy is time the device
waited on the host. Without a GPU it says so and exits 0; --cpu-check runs it anyway (e.g. `--cpu-check
--model small --shapes 2x64 --normalizers softmax`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from bench_common import med, mib, peak_bytes, table, write_section

from attnlab.run.throughput import flops_per_token

SECTION = "## GPU: attnlab step vs a hand-written JAX step (scripts/bench_gpu.py)"
SAME_MATH = " with β and clipping"  # the label of the hand-written step with attnlab's math (handwritten's same_math)
ROOT = Path(__file__).resolve().parents[1]


def timed_ms(fn, state, data, steps: int) -> tuple[float, object]:
    """Median ms per call of state -> fn(state, data) (two warm-up calls), and the last state."""
    import time

    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        state = fn(state, data)
        jax.block_until_ready(state)
        if i >= 2:
            times.append(time.perf_counter() - t)
    return 1e3 * med(times), state


def device_profile(fn, state, data, steps: int, trace_dir: Path) -> tuple[dict, object]:
    """`steps` calls of state -> fn(state, data), dispatched as a training loop dispatches them, traced by
    jax.profiler: (profile_summary, the last state)."""
    import time

    from jax.profiler import ProfileData

    trace_dir.mkdir(parents=True, exist_ok=True)
    state = fn(state, data)  # the first call after timing pays no compile, but keep it out of the trace anyway
    jax.block_until_ready(state)
    with jax.profiler.trace(str(trace_dir)):
        start = time.perf_counter()
        for _ in range(steps):
            state = fn(state, data)
        jax.block_until_ready(state)
        wall_s = time.perf_counter() - start
    path = max(trace_dir.glob("**/*.xplane.pb"), key=lambda f: f.stat().st_mtime)
    return profile_summary(ProfileData.from_file(str(path)), steps, wall_s), state


def profile_summary(profile, steps: int, wall_s: float, top: int = 6) -> dict:
    """Per step: wall ms, the device's busy ms (union of event intervals on its stream lines), events, and the
    `top` event names by total time (ms per step, calls per step). On a CPU (no device plane) the host's XLA
    threads stand in, so the script can be checked without a GPU."""
    planes = [p for p in profile.planes if p.name.startswith("/device:")]
    planes = planes or [p for p in profile.planes if p.name == "/host:CPU"]
    spans, by_name = [], {}
    for plane in planes:
        lines = list(plane.lines)
        # A GPU plane's kernels and copies sit on its "Stream #n" lines (derived lines such as "XLA Ops" repeat them).
        streams = [ln for ln in lines if ln.name.startswith("Stream")]
        for line in streams or [ln for ln in lines if "XLA" in ln.name]:
            for ev in line.events:
                if ev.duration_ns <= 0:
                    continue
                spans.append((ev.start_ns, ev.start_ns + ev.duration_ns))
                total, count = by_name.get(ev.name, (0.0, 0))
                by_name[ev.name] = (total + ev.duration_ns, count + 1)
    busy_ns, end = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        busy_ns += max(0.0, hi - max(lo, end))
        end = max(end, hi)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "wall_ms": 1e3 * wall_s / steps,
        "busy_ms": busy_ns / 1e6 / steps,
        "events": len(spans) / steps,
        "top": [(name, t / 1e6 / steps, c / steps) for name, (t, c) in ranked],
    }


def profile_lines(label: str, summary: dict) -> list[str]:
    """The markdown lines of one profiled step."""
    head = (
        f"- {label}: {summary['wall_ms']:.2f} ms wall per step, device busy {summary['busy_ms']:.2f} ms "
        f"({100 * summary['busy_ms'] / summary['wall_ms']:.0f}%), {summary['events']:.0f} kernels and copies per step"
    )
    top = [f"  - {ms:.3f} ms × {n:g}: `{name[:90]}`" for name, ms, n in summary["top"]]
    return [head, *top]


def compose(overrides: list[str]):
    """The run's composed config for `overrides` (the train.yaml defaults otherwise)."""
    import hydra

    from attnlab.config import registry

    with hydra.initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        return hydra.compose("train", overrides=overrides)


def attnlab_run(overrides: list[str], mesh=None) -> dict:
    """The compiled steps of `attnlab-train <overrides>`, built as the CLI builds them: assembly.assemble, the run's
    matmul precision (accelerator.apply_matmul_precision), the data train.fit draws batches from (for task=lm the
    text stream, sampled on device at each step) and train.loop.compile_steps.

    Keys: steps (train.loop.CompiledSteps: plain, and the logging step as the loop calls it), statistics
    (the logging step's statistics program), state, data, n_params, impl (per layer), cfg. With `mesh` (a
    compile-only GPU topology, scripts/gpu_program.py) state and data are ShapeDtypeStructs on it.
    """
    from flax import nnx

    from attnlab.accelerator import apply_matmul_precision, data_mesh
    from attnlab.config.assembly import assemble
    from attnlab.model.groups import leaf_groups
    from attnlab.run.files import compute_record
    from attnlab.steps import probes_per_layer
    from attnlab.train import train_data
    from attnlab.train.loop import compile_steps
    from attnlab.train.state import Placement, fresh_state

    cfg = compose(overrides)
    task, nets, tx, loop = assemble(cfg, cfg.task.default_head)
    with contextlib.redirect_stderr(io.StringIO()):  # the run's header line
        precision = apply_matmul_precision(cfg.accelerator.get("matmul_precision"), nets[0].body.dtype)
        impl = compute_record(nets[0], task.seq_len, precision)["attention_impl"]
    net, S = nets[0], len(nets)
    graphdef, params, _ = nnx.split(net, nnx.Param, ...)
    groups, layers = leaf_groups(params)
    placement = Placement.of(mesh if mesh is not None else data_mesh(), S)
    state, data = fresh_state(nets, tx, cfg.seed), train_data(task, Placement.of(data_mesh(), S))
    if mesh is None:
        state = jax.device_put(state, placement.per_seed)
    else:
        state, data = abstract(state, placement.per_seed), abstract(data, placement.replicated)
    steps = compile_steps(
        graphdef,
        tx,
        state,
        data,
        loop,
        placement,
        groups=groups,
        layers=layers,
        num_layers=len(net.body.blocks),
        num_heads=net.body.blocks[0].attn.num_heads,
        probe_layers=probes_per_layer(net),
        num_seeds=S,
        scored_k=task.scored_positions(),
    )
    return {
        "steps": steps,
        "statistics": steps.statistics_program,
        "state": state,
        "data": data,
        "cfg": cfg,
        "n_params": sum(x.size for x in jax.tree.leaves(params)),
        "impl": impl,
    }


def abstract(tree, sharding):
    """Each array of `tree` as a ShapeDtypeStruct placed by `sharding`."""
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=sharding), tree)


def reference_dims(cfg) -> dict:
    """The hand-written step's sizes for a run's config: the same model (model=base: d 512, 8 heads, 8 layers)."""
    m = cfg.model
    return {"D": m.d_model, "N": m.heads, "L": m.layers, "mlp_ratio": m.mlp_ratio}


def handwritten(
    B: int,
    T: int,
    V: int = 257,
    D: int = 512,
    N: int = 8,
    L: int = 8,
    mlp_ratio: int = 4,
    impl: str = "cudnn",
    same_math: bool = False,
):
    """(jitted step, state, data, param count): the same model in plain jnp, bfloat16 with the platform's
    default matmul precision (a bf16 run's), cuDNN attention (`impl`).

    `same_math` adds what an attnlab softmax run computes beyond it: a learned per-head inverse temperature β = exp(θ)
    folded into q (backends/fused.py) and the gradient clipped by its global norm (optim.py, the norm from
    one reduction, steps.leaf_sums). Still left out: the finiteness check and skip of non-finite steps, the
    gradient norms returned for logging, and the step's RNG and schedule scalars."""
    import optax

    from attnlab.accelerator import apply_matmul_precision
    from attnlab.model.attention import rope
    from attnlab.optim import clip_by_global_norm
    from attnlab.steps import leaf_sums

    apply_matmul_precision(None, jnp.bfloat16)

    H = D // N
    k = iter(jax.random.split(jax.random.key(0), 4 * L + 2))
    dense = lambda i, o: jax.random.normal(next(k), (i, o), jnp.float32) / math.sqrt(i)  # noqa: E731
    ln = lambda: {"scale": jnp.ones((D,)), "bias": jnp.zeros((D,))}  # noqa: E731
    params = {
        "embed": jax.random.normal(next(k), (V, D)) * 0.02,
        "ln_f": ln(),
        "head": dense(D, V),
        "blocks": [
            {
                "ln1": ln(),
                "ln2": ln(),
                "qkv": dense(D, 3 * D),
                "out": dense(D, D),
                "fc1": dense(D, mlp_ratio * D),
                "b1": jnp.zeros((mlp_ratio * D,)),
                "fc2": dense(mlp_ratio * D, D),
                "b2": jnp.zeros((D,)),
            }
            for _ in range(L)
        ],
    }
    if same_math:
        for blk in params["blocks"]:
            blk["log_beta"] = jnp.full((N,), -0.5 * math.log(H))  # β = exp(θ), as normalizers/base.py learns it

    def norm(x, p):
        xf = x.astype(jnp.float32)
        mean = xf.mean(-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(jnp.square(xf - mean).mean(-1, keepdims=True) + 1e-6)
        return (y * p["scale"][None, None] + p["bias"][None, None]).astype(jnp.bfloat16)

    def loss_fn(p, inputs_BT, targets_BT):
        p16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), p)
        x = p16["embed"][inputs_BT]
        pos_T = jnp.arange(T)
        for i, blk in enumerate(p16["blocks"]):
            q, kk, v = (norm(x, blk["ln1"]) @ blk["qkv"]).reshape(B, T, 3, N, H).transpose(2, 0, 3, 1, 4)
            q, kk = (rope(a, pos_T).transpose(0, 2, 1, 3) for a in (q, kk))
            scale = None
            if same_math:  # β in float32 on q, as attnlab folds it (scale 1)
                beta_N = jnp.exp(p["blocks"][i]["log_beta"])
                q, scale = (q.astype(jnp.float32) * beta_N[None, None, :, None]).astype(q.dtype), 1.0
            o = jax.nn.dot_product_attention(
                q, kk, v.transpose(0, 2, 1, 3), is_causal=True, implementation=impl, scale=scale
            )
            x = x + o.reshape(B, T, D) @ blk["out"]
            x = (
                x
                + jax.nn.gelu(norm(x, blk["ln2"]) @ blk["fc1"] + blk["b1"][None, None]) @ blk["fc2"]
                + blk["b2"][None, None]
            )
        logits = (norm(x, p16["ln_f"]) @ p16["head"]).astype(jnp.float32)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, targets_BT[..., None], -1)[..., 0])

    tx = optax.chain(clip_by_global_norm(1.0), optax.adamw(1e-4)) if same_math else optax.adamw(1e-4)

    def step(state, data):
        params, opt_state = state
        grads = jax.grad(loss_fn)(params, data["inputs"], data["targets"])
        extra = {}
        if same_math:
            sq = leaf_sums(jax.tree.leaves(grads), lambda g: jnp.square(g.astype(jnp.float32)))
            extra["grad_norm"] = jnp.sqrt(sq.sum())
        updates, opt_state = tx.update(grads, opt_state, params, **extra)
        return optax.apply_updates(params, updates), opt_state

    rng = np.random.default_rng(0)
    data = {
        "inputs": jnp.asarray(rng.integers(1, V, (B, T)), jnp.int32),
        "targets": jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32),
    }
    state = (params, tx.init(params))
    return jax.jit(step, donate_argnums=0), state, data, sum(x.size for x in jax.tree.leaves(params))


def mfu(n_params: int, B: int, T: int, ms: float, peak_tflops: float, L: int = 8, D: int = 512) -> float:
    """Model FLOPs utilisation: 6·params + 12·L·T·d FLOPs per token (Chowdhery et al. 2022, PaLM, Appendix B)."""
    return flops_per_token(n_params, L, T, D) * B * T / (ms / 1e3) / (peak_tflops * 1e12)


def run_overrides(name: str, B: int, T: int, dtype: str, model: str) -> list[str]:
    """The `attnlab-train` overrides of one row: model, task=lm at seq_len T, batch B, normalizer, dtype; a name
    `normalizer@impl` (e.g. sigmoid@pallas) sets normalizer.impl too."""
    name, _, impl = name.partition("@")
    return [
        f"model={model}",
        "task=lm",
        f"task.seq_len={T}",
        f"trainer.batch_size={B}",
        f"normalizer={name}",
        *([f"normalizer.impl={impl}"] if impl else []),
        f"accelerator.dtype={dtype}",
        "task.n_train=64",
        "task.n_val=8",
        "task.n_test=8",
    ]


def reference_row(
    B: int, T: int, model: str, steps: int, peak_tflops: float, on_gpu: bool, profiler=None, same_math: bool = False
) -> list:
    """The hand-written step's row (cuDNN attention on a GPU, XLA's elsewhere; `same_math`: with attnlab's β and
    clipping); `profiler(label, fn, state, data)` traces it."""
    dims = reference_dims(compose(run_overrides("softmax", B, T, "bfloat16", model)))
    impl = "cudnn" if on_gpu else "xla"
    step, state, data, n = handwritten(B, T, **dims, impl=impl, same_math=same_math)
    step = step.lower(state, data).compile()
    ms, state = timed_ms(step, state, data, steps)
    label = f"hand-written ({impl})" + (SAME_MATH if same_math else "")
    if profiler is not None:
        profiler(f"B={B} T={T} {label}", step, state, data)
    return [
        f"B={B} T={T}",
        label,
        impl,
        f"{ms:.1f}",
        f"{100 * mfu(n, B, T, ms, peak_tflops, dims['L'], dims['D']):.1f}%",
        mib(peak_bytes(step)),
        "—",
    ]


def attnlab_row(
    name: str, dtype: str, B: int, T: int, model: str, steps: int, peak_tflops: float, profiler=None
) -> list:
    """One attnlab row: its plain step and its logging step, timed as the loop calls them; `profiler` traces the
    plain step."""
    run = attnlab_run(run_overrides(name, B, T, dtype, model))
    plain, logging, state, data = run["steps"].plain, run["steps"].stats, run["state"], run["data"]
    m = run["cfg"].model
    ms, state = timed_ms(lambda s, d: plain(s, d)[0], state, data, steps)
    if profiler is not None:
        state = profiler(f"B={B} T={T} attnlab {name} {dtype} plain step", lambda s, d: plain(s, d)[0], state, data)
    ms_log, _ = timed_ms(lambda s, d: logging(s, d)[0], state, data, max(steps // 4, 3))
    return [
        f"B={B} T={T}",
        f"attnlab {name} {dtype}",
        "/".join(sorted(set(run["impl"]))),
        f"{ms:.1f}",
        f"{100 * mfu(run['n_params'], B, T, ms, peak_tflops, m.layers, m.d_model):.1f}%",
        mib(peak_bytes(run["steps"].train_program)),
        f"{ms_log:.1f}",
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps per row (median)")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--long-all", action="store_true", help="every normalizer at B=4 T=8192 too")
    p.add_argument("--shapes", default="32x1024,4x8192", help="BxT, comma-separated (the first: every normalizer)")
    p.add_argument("--normalizers", default="all", help="comma-separated names (name@impl sets its impl), or all")
    p.add_argument("--no-float32", action="store_true", help="leave out the attnlab softmax float32 row")
    p.add_argument("--model", default="base", help="the model config of every row (the reference follows its sizes)")
    p.add_argument(
        "--cpu-check",
        action="store_true",
        help="run on whatever JAX sees, e.g. a CPU at a tiny --shapes/--model: a check that the script runs",
    )
    p.add_argument("--profile", type=Path, help="trace the reference and attnlab softmax bf16 into this folder")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    args = p.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    if not on_gpu and not args.cpu_check:
        print(f"bench_gpu: no GPU (JAX {jax.__version__} sees {jax.default_backend()}); nothing measured")
        return 0
    from attnlab.config import registry

    names = registry.choices("normalizer") if args.normalizers == "all" else args.normalizers.split(",")
    rows, lines, profiled = [], [], []

    def profiler(label, fn, state, data):
        summary, state = device_profile(fn, state, data, args.profile_steps, args.profile / f"trace{len(profiled)}")
        profiled.extend(profile_lines(label, summary))
        print("\n".join(profiled[-1 - len(summary["top"]) :]), flush=True)
        return state

    trace = profiler if args.profile else None
    for i, shape in enumerate(args.shapes.split(",")):
        B, T = (int(x) for x in shape.lower().split("x"))
        for same_math in (False, True):
            profile = trace if not same_math else None
            rows.append(reference_row(B, T, args.model, args.steps, args.peak_tflops, on_gpu, profile, same_math))
            print(" | ".join(rows[-1]), flush=True)
        variants = [(n, "bfloat16") for n in (names if i == 0 or args.long_all else ["softmax"])]
        for name, dtype in variants + ([("softmax", "float32")] if i == 0 and not args.no_float32 else []):
            try:
                profile = trace if (name, dtype) == ("softmax", "bfloat16") else None
                rows.append(attnlab_row(name, dtype, B, T, args.model, args.steps, args.peak_tflops, profile))
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory: the row says so, the others still run
                rows.append(
                    [
                        f"B={B} T={T}",
                        f"attnlab {name} {dtype}",
                        "—",
                        f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}",
                        "—",
                        "—",
                        "—",
                    ]
                )
            print(" | ".join(rows[-1]), flush=True)
    lines += [
        SECTION,
        "",
        f"Device: {jax.devices()[0].device_kind}, JAX {jax.__version__}; median of {args.steps} "
        f"steps; MFU against {args.peak_tflops:g} TFLOP/s.",
        "",
    ]
    lines += table(["shape", "step", "attention", "ms/step", "MFU", "peak MiB", "logging step ms"], rows)
    if profiled:
        lines += ["", f"Profile ({args.profile_steps} steps each, jax.profiler; not the timed steps above):", ""]
        lines += profiled
    print("\n".join(lines))
    if args.write:
        write_section("\n".join(lines) + "\n", ROOT / "BENCHMARKS.md", (SECTION,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
