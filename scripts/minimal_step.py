"""Hand-written JAX + optax train steps for the default experiment: bench_train.py's limits.

The same function as attnlab's default step (pre-LN transformer, token + learned positions, qkv/out
projections without bias, causal ∧ key-padding softmax attention at the fixed scale 1/√H, GELU MLP,
final LayerNorm, linear head, weighted cross-entropy; optax clip + AdamW with attnlab's schedule,
decay mask and hyper-parameters; batch drawn on device with attnlab's key scheme), written in
plain jnp with heads-major (B,N,T,H) attention operands and nothing else: no statistics, no
non-finite guard, β not learned. `fast=True` swaps in attnlab's hand-written backwards
(attnlab.model.backward's matmul and GELU, softmax_vjp's attention): the fastest step we can write;
`fast=False` is plain autodiff.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from attnlab.backends.softmax_vjp import softmax_attention
from attnlab.model.backward import gelu, matmul


def params_of(net) -> dict:
    """attnlab's initial parameters as a plain dict."""
    b = nnx.to_pure_dict(nnx.state(net, nnx.Param))
    body = b["body"]
    blocks = [
        {
            "ln1": blk["ln1"],
            "ln2": blk["ln2"],
            "fc1": blk["fc1"],
            "fc2": blk["fc2"],
            "qkv": blk["attn"]["qkv"]["kernel"],
            "out": blk["attn"]["out"]["kernel"],
        }
        for _, blk in sorted(body["blocks"].items())
    ]
    tree = {
        "embed": body["embed"]["embedding"],
        "pos": body["pos"]["embedding"],
        "blocks": blocks,
        "ln_f": body["ln_f"],
        "head": b["head"]["proj"],
    }
    return jax.tree.map(jnp.array, tree)  # copies: the step donates its state


def layer_norm(x, p, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def forward(p, inputs_BT, valid_BT, num_heads: int, fast: bool):
    B, T = inputs_BT.shape
    D = p["embed"].shape[1]
    H = D // num_heads
    x_BTD = p["embed"][inputs_BT] + p["pos"][:T][None]
    m_B1TS = jnp.tril(jnp.ones((T, T), bool))[None, None] & valid_BT[:, None, None, :]
    mm, act = (matmul, gelu) if fast else (jnp.matmul, jax.nn.gelu)
    beta_N = jnp.full((num_heads,), 1.0 / math.sqrt(H))
    for blk in p["blocks"]:
        qkv = mm(layer_norm(x_BTD, blk["ln1"]), blk["qkv"]).reshape(B, T, 3, num_heads, H).transpose(2, 0, 3, 1, 4)
        if fast:
            o_BNTH = softmax_attention(qkv[0], qkv[1], qkv[2], beta_N, m_B1TS)
        else:
            z_BNTS = jnp.einsum("bnth,bnsh->bnts", qkv[0], qkv[1]) * beta_N[0]
            a_BNTS = jax.nn.softmax(jnp.where(m_B1TS, z_BNTS, jnp.finfo(z_BNTS.dtype).min), axis=-1)
            o_BNTH = jnp.einsum("bnts,bnsh->bnth", a_BNTS, qkv[2])
        x_BTD = x_BTD + mm(o_BNTH.transpose(0, 2, 1, 3).reshape(B, T, D), blk["out"])
        h = act(mm(layer_norm(x_BTD, blk["ln2"]), blk["fc1"]["kernel"]) + blk["fc1"]["bias"])
        x_BTD = x_BTD + mm(h, blk["fc2"]["kernel"]) + blk["fc2"]["bias"]
    return layer_norm(x_BTD, p["ln_f"]) @ p["head"]["kernel"] + p["head"]["bias"]


def loss_fn(p, batch, num_heads, fast):
    logits = forward(p, batch["inputs"], batch["valid"], num_heads, fast)
    nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, batch["targets"][..., None], -1)[..., 0]
    w = batch["weights"].astype(nll.dtype)
    return (w * nll).sum() / jnp.maximum(w.sum(), 1.0)


def compiled(net, cfg, loop, data, fast: bool):
    """(compiled step, state) with state = (params, opt_state, step, key), started from net's parameters."""
    o, num_heads = cfg.optim, cfg.model.heads
    params = params_of(net)
    sched = optax.warmup_cosine_decay_schedule(
        0.0, o.lr, max(o.warmup_steps, 1), max(loop.steps, o.warmup_steps + 1), end_value=o.lr * o.final_fraction
    )
    tx = optax.chain(
        optax.clip_by_global_norm(o.clip_norm),
        optax.adamw(
            sched, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay, mask=jax.tree.map(lambda a: a.ndim >= 2, params)
        ),
    )

    def step(state, data):
        params, opt_state, i, key = state
        batch = data.draw(jax.random.fold_in(key, i), loop.batch_size)  # the task's rows, as attnlab draws them
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, num_heads, fast)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, i + 1, key), loss

    state = (params, tx.init(params), jnp.zeros((), jnp.int32), jax.random.key(loop.seed))
    return jax.jit(step, donate_argnums=0).lower(state, data).compile(), state
