#!/usr/bin/env python
"""The token embedding's gradient on a GPU: scatter-add against a one-hot matmul, by token distribution.

dW (V,D) = Σ_n e_{id_n} g_nᵀ for N = 32768 tokens, D = 512, V = 257 (bytes), as the model=base lm step computes
it: XLA's scatter-add of the bfloat16 cotangent (as autodiff of jnp.take gives it), the model's lookup
(model.backward.take_rows: the same scatter in float32), and a one-hot matmul (f32 accumulation). Token ids uniform
over V (the hand-written reference's random batches) and the shipped lm text's bytes (skewed: a few byte values
take most updates, so scatter atomics contend on their rows). Prints the median ms of --reps calls of each.
Without a GPU it says so and exits 0 (--cpu-check runs anyway). `--ptx h100` needs no GPU: it compiles each
variant for that target (gpu_program.py's deviceless compile, the CUDA plugin installed) and counts the atomic
instructions in its PTX, the instructions a scatter's contended rows serialise on.
"""

from __future__ import annotations

import argparse
import collections
import glob
import re
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from bench_common import med


def ids_of(kind: str, N: int, V: int) -> np.ndarray:
    """N token ids: uniform over 1..V-1, or N consecutive bytes of the shipped lm text."""
    if kind == "uniform":
        return np.random.default_rng(0).integers(1, V, N)
    from attnlab.tasks.lm import corpus

    text = b"".join(corpus.pydoc_topics()[0])
    return np.frombuffer(text[:N], np.uint8).astype(np.int32)


def variants(table_VD):
    """name -> (ids, g) -> dW: the model's own lookup (model.backward.take_rows: the scatter in float32, the reference
    of the error column), autodiff of the bfloat16 lookup (its bf16 scatter), and a one-hot matmul."""
    from attnlab.model.backward import take_rows

    def pulled_back(lookup):
        return lambda ids, g: jax.vjp(lambda t: lookup(t, ids), table_VD)[1](g)[0]

    def one_hot(ids, g):
        V = table_VD.shape[0]
        return jnp.einsum("nv,nd->vd", jax.nn.one_hot(ids, V, dtype=g.dtype), g, preferred_element_type=jnp.float32)

    return {
        "take_rows f32": pulled_back(lambda t, ids: take_rows(t, ids, jnp.bfloat16)),
        "scatter bf16": pulled_back(lambda t, ids: jnp.take(t.astype(jnp.bfloat16), ids, axis=0)),
        "one-hot matmul": one_hot,
    }


def ptx_atomics(target: str, tokens: int, dim: int, vocab: int) -> dict[str, collections.Counter]:
    """Per variant, the atomic instructions in the PTX XLA compiles it to for `target`, without a GPU."""
    from gpu_program import on_target

    found = {}
    with on_target(target) as mesh:
        on = jax.sharding.SingleDeviceSharding(mesh.devices.flat[0])
        ids = jax.ShapeDtypeStruct((tokens,), jnp.int32, sharding=on)
        g = jax.ShapeDtypeStruct((tokens, dim), jnp.bfloat16, sharding=on)
        for name, fn in variants(jnp.zeros((vocab, dim))).items():
            with tempfile.TemporaryDirectory() as dump:
                jax.jit(fn).lower(ids, g).compile(compiler_options={"xla_dump_to": dump})
                ptx = "".join(Path(path).read_text() for path in glob.glob(f"{dump}/*.ptx"))
            found[name] = collections.Counter(re.findall(r"\b(?:atom|red)\.[\w.]+", ptx))
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--vocab", type=int, default=257)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--cpu-check", action="store_true")
    p.add_argument("--ptx", metavar="TARGET", help="deviceless: the atomics each variant compiles to (h100, a100)")
    args = p.parse_args(argv)
    if args.ptx:
        for name, atomics in ptx_atomics(args.ptx, args.tokens, args.dim, args.vocab).items():
            print(f"{args.ptx} {name:15s} atomics in the PTX: {dict(atomics) or 'none'}")
        return 0
    if jax.default_backend() != "gpu" and not args.cpu_check:
        print(f"bench_embedding_grad: no GPU (JAX sees {jax.default_backend()}); nothing measured")
        return 0
    g = jax.random.normal(jax.random.key(0), (args.tokens, args.dim), jnp.bfloat16)
    print(f"{jax.devices()[0].device_kind}, JAX {jax.__version__}: N={args.tokens} D={args.dim} V={args.vocab}")
    for kind in ("uniform", "lm text"):
        ids = jnp.asarray(ids_of(kind, args.tokens, args.vocab))
        ref = None
        table = jax.random.normal(jax.random.key(1), (args.vocab, args.dim))
        for name, fn in variants(table).items():
            f = jax.jit(fn)
            out = f(ids, g).block_until_ready()
            ref = out.astype(jnp.float32) if ref is None else ref
            times = []
            for _ in range(args.reps):
                t = time.perf_counter()
                f(ids, g).block_until_ready()
                times.append(time.perf_counter() - t)
            err = float(jnp.abs(out.astype(jnp.float32) - ref).max() / jnp.abs(ref).max())
            print(f"{kind:8s} {name:15s} {1e3 * med(times):8.3f} ms   max |Δ| / max |ref| vs take_rows f32: {err:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
