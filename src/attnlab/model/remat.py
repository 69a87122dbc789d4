"""Running the transformer's blocks, optionally rematerialised (`model.remat`).

remat=true keeps only each block's input for the backward pass and recomputes the block
(jax.checkpoint); "dots" also keeps the outputs of its matmuls without batch dimensions
(jax.checkpoint_policies.dots_with_no_batch_dims_saveable: the projections and the MLP, not the
attention products). Identical blocks run as one jax.lax.scan over their stacked states with a
checkpointed body: the scan fixes the order of the backward, so the recomputation happens layer
by layer. Unrolled checkpointed blocks save nothing on XLA's CPU backend, whose scheduler hoists
the recomputation (measured with memory_analysis; BENCHMARKS.md, "Train-step memory"); blocks that
differ (model.layer_normalizers) fall back to that unrolled form.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx


def run_blocks(blocks, x_BTD, mask, probes, rngs, *, remat, with_stats: bool, deterministic: bool):
    """x after every block, the list of each block's statistics, and with them (`with_stats`) the list of each
    block's (output, value norms): the residual stream it leaves and its tokens' ‖v‖ (statistics.residual); [] without.

    With remat and dropout, each block's dropout key is one draw of the outer `rngs` stream, so
    the masks differ from remat=false (the losses agree exactly without dropout).
    """

    def run(block, x_BTD, probe, r):
        return block(x_BTD, mask, with_stats=with_stats, score_probe_BNTS=probe, deterministic=deterministic, rngs=r)

    if not remat:
        per_layer, outputs = [], []
        for i, block in enumerate(blocks):
            x_BTD, stats, value_norm_BNT = run(block, x_BTD, None if probes is None else probes[i], rngs)
            per_layer.append(stats)
            outputs.append((x_BTD, value_norm_BNT))
        return x_BTD, per_layer, outputs if with_stats else []
    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable if remat == "dots" else None
    split = [nnx.split(block) for block in blocks]
    L = len(split)
    keys = None if rngs is None or deterministic else jax.random.split(rngs.dropout(), L)

    def pure(graphdef, state, x_BTD, probe, key):
        return run(nnx.merge(graphdef, state), x_BTD, probe, None if key is None else nnx.Rngs(dropout=key))

    if any(g != split[0][0] for g, _ in split):  # heterogeneous layers: unrolled (no saving on CPU)
        per_layer, outputs = [], []
        for i, (graphdef, state) in enumerate(split):
            step = jax.checkpoint(functools.partial(pure, graphdef), policy=policy)
            probe, key = None if probes is None else probes[i], None if keys is None else keys[i]
            x_BTD, stats, value_norm_BNT = step(state, x_BTD, probe, key)
            per_layer.append(stats)
            outputs.append((x_BTD, value_norm_BNT))
        return x_BTD, per_layer, outputs if with_stats else []
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[s for _, s in split])
    probes_L = None if probes is None else jnp.stack(probes)

    @functools.partial(jax.checkpoint, policy=policy)
    def body(x_BTD, xs):
        state, probe, key = xs
        x_BTD, stats, value_norm_BNT = pure(split[0][0], state, x_BTD, probe, key)
        return x_BTD, (stats, (x_BTD, value_norm_BNT) if with_stats else None)

    x_BTD, (stats_L, outputs_L) = jax.lax.scan(body, x_BTD, (stacked, probes_L, keys))
    per_layer = [{k: v[i] for k, v in stats_L.items()} for i in range(L)]
    return x_BTD, per_layer, [] if outputs_L is None else [(outputs_L[0][i], outputs_L[1][i]) for i in range(L)]
