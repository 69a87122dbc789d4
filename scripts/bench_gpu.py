#!/usr/bin/env python
"""attnlab's compiled train step against a hand-written JAX step of the same model on a GPU (issue 26).

model=base (d 512, 8 heads, 8 layers, RoPE), task=lm, bfloat16 compute, at B=32 T=1024 (every
normalizer) and B=4 T=8192 (softmax, or every normalizer with --long-all). Per row: ms per step (the
median of --steps calls after two warm-up calls), MFU = (6·params + 12·L·T·d)·tokens/s / --peak-tflops
(989: H100 SXM bf16 dense), XLA's compiled peak memory, and the logging step (statistics program +
train step, as the loop runs it). The hand-written step: plain jnp, float32 parameters cast to
bfloat16, jax.nn.dot_product_attention(implementation='cudnn', is_causal=True), optax AdamW.
Also attnlab softmax in float32 (the goal: bf16 faster). Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench_common import med, mib, peak_bytes, table, write_section

SECTION = "## GPU: attnlab step vs a hand-written JAX step (scripts/bench_gpu.py)"
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


def attnlab_steps(normalizer: str, B: int, T: int, dtype: str):
    """(compiled plain step, logging step, state, data, param count, cfg) built as the CLI builds them."""
    import hydra
    from flax import nnx

    from attnlab import registry
    from attnlab.cli import build
    from attnlab.groups import leaf_groups
    from attnlab.steps import make_stats_step, make_train_step, probes_supported
    from attnlab.train import pad_split
    from attnlab.train.state import fresh_state

    overrides = ["model=base", "task=lm", f"task.seq_len={T}", f"trainer.batch_size={B}", f"normalizer={normalizer}",
                 f"accelerator.dtype={dtype}", "task.n_train=256", "task.n_val=8", "task.n_test=8"]
    with hydra.initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        cfg = hydra.compose("train", overrides=overrides)
    task, nets, tx, _ = build(cfg, cfg.task.default_head)
    net = nets[0]
    graphdef, params, _ = nnx.split(net, nnx.Param, ...)
    groups, layers = leaf_groups(params)
    state = fresh_state([net], tx, seed=0)
    data = jax.device_put(pad_split(task.splits["train"], 1))
    shape = dict(num_layers=len(net.body.blocks), num_heads=net.body.blocks[0].attn.num_heads, batch_size=B,
                 batch_sharding=None)
    plain = make_train_step(graphdef, tx, groups=groups, layers=layers, **shape).lower(state, data).compile()
    stats = make_stats_step(graphdef, probe_scores=probes_supported(net), **shape).lower(state, data).compile()

    def logging_step(state, data):
        extra = stats(state, data)
        return plain(state, data)[0], extra

    n_params = sum(x.size for x in jax.tree.leaves(params))
    return plain, logging_step, state, data, n_params, net.body.attention_impl(T)


def handwritten(B: int, T: int, V: int = 257, D: int = 512, N: int = 8, L: int = 8, impl: str = "cudnn"):
    """(compiled step, state, data, param count): the same model in plain jnp, cuDNN attention (`impl`)."""
    import optax

    from attnlab.attention import rope

    H = D // N
    k = iter(jax.random.split(jax.random.key(0), 4 * L + 2))
    dense = lambda i, o: jax.random.normal(next(k), (i, o), jnp.float32) / math.sqrt(i)  # noqa: E731
    ln = lambda: {"scale": jnp.ones((D,)), "bias": jnp.zeros((D,))}  # noqa: E731
    params = {"embed": jax.random.normal(next(k), (V, D)) * 0.02, "ln_f": ln(), "head": dense(D, V),
              "blocks": [{"ln1": ln(), "ln2": ln(), "qkv": dense(D, 3 * D), "out": dense(D, D),
                          "fc1": dense(D, 4 * D), "b1": jnp.zeros((4 * D,)), "fc2": dense(4 * D, D),
                          "b2": jnp.zeros((D,))} for _ in range(L)]}

    def norm(x, p):
        xf = x.astype(jnp.float32)
        mean = xf.mean(-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(jnp.square(xf - mean).mean(-1, keepdims=True) + 1e-6)
        return (y * p["scale"] + p["bias"]).astype(jnp.bfloat16)

    def loss_fn(p, inputs_BT, targets_BT):
        p16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), p)
        x = p16["embed"][inputs_BT]
        pos_T = jnp.arange(T)
        for blk in p16["blocks"]:
            q, kk, v = (norm(x, blk["ln1"]) @ blk["qkv"]).reshape(B, T, 3, N, H).transpose(2, 0, 3, 1, 4)
            q, kk = (rope(a, pos_T).transpose(0, 2, 1, 3) for a in (q, kk))
            o = jax.nn.dot_product_attention(q, kk, v.transpose(0, 2, 1, 3), is_causal=True, implementation=impl)
            x = x + o.reshape(B, T, D) @ blk["out"]
            x = x + jax.nn.gelu(norm(x, blk["ln2"]) @ blk["fc1"] + blk["b1"]) @ blk["fc2"] + blk["b2"]
        logits = (norm(x, p16["ln_f"]) @ p16["head"]).astype(jnp.float32)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, targets_BT[..., None], -1)[..., 0])

    tx = optax.adamw(1e-4)

    def step(state, data):
        params, opt_state = state
        grads = jax.grad(loss_fn)(params, data["inputs"], data["targets"])
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    rng = np.random.default_rng(0)
    data = {"inputs": jnp.asarray(rng.integers(1, V, (B, T)), jnp.int32),
            "targets": jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)}
    state = (params, tx.init(params))
    return jax.jit(step, donate_argnums=0).lower(state, data).compile(), state, data, \
        sum(x.size for x in jax.tree.leaves(params))


def mfu(n_params: int, B: int, T: int, ms: float, peak_tflops: float, L: int = 8, D: int = 512) -> float:
    """Model FLOPs utilisation, the issue's formula (6·params + 12·L·T·d per token)."""
    return (6 * n_params + 12 * L * T * D) * B * T / (ms / 1e3) / (peak_tflops * 1e12)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps per row (median)")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--long-all", action="store_true", help="every normalizer at B=4 T=8192 too")
    p.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    args = p.parse_args()
    if jax.default_backend() != "gpu":
        print(f"bench_gpu: no GPU (JAX {jax.__version__} sees {jax.default_backend()}); nothing measured")
        return 0
    from attnlab import registry

    rows, lines = [], []
    for B, T in ((32, 1024), (4, 8192)):
        names = registry.choices("normalizer") if T == 1024 or args.long_all else ["softmax"]
        step, state, data, n = handwritten(B, T)
        ms, _ = timed_ms(step, state, data, args.steps)
        rows.append([f"B={B} T={T}", "hand-written (cuDNN)", "cudnn", f"{ms:.1f}", f"{100 * mfu(n, B, T, ms, args.peak_tflops):.1f}%",
                     mib(peak_bytes(step)), "—"])
        variants = [(n, "bfloat16") for n in names] + ([("softmax", "float32")] if T == 1024 else [])
        for name, dtype in variants:
            try:
                plain, logging_step, state, data, n, impls = attnlab_steps(name, B, T, dtype)
                ms, state = timed_ms(lambda s, d: plain(s, d)[0], state, data, args.steps)
                ms_log, _ = timed_ms(lambda s, d: logging_step(s, d)[0], state, data, max(args.steps // 4, 3))
                rows.append([f"B={B} T={T}", f"attnlab {name} {dtype}", impls[0], f"{ms:.1f}",
                             f"{100 * mfu(n, B, T, ms, args.peak_tflops):.1f}%", mib(peak_bytes(plain)), f"{ms_log:.1f}"])
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory: the row says so, the others still run
                rows.append([f"B={B} T={T}", f"attnlab {name} {dtype}", "—", f"failed: {type(exc).__name__}",
                             "—", "—", "—"])
            print(" | ".join(rows[-1]), flush=True)
    lines += [SECTION, "", f"Device: {jax.devices()[0].device_kind}, JAX {jax.__version__}; median of {args.steps} "
              f"steps; MFU against {args.peak_tflops:g} TFLOP/s.", ""]
    lines += table(["shape", "step", "attention", "ms/step", "MFU", "peak MiB", "logging step ms"], rows)
    print("\n".join(lines))
    if args.write:
        write_section("\n".join(lines) + "\n", ROOT / "BENCHMARKS.md", (SECTION,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
