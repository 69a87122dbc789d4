"""The final metrics' attention statistics: what each declares (`Statistic.final`, `rate`, `of_maps`) turned into
example-weighted sums per eval batch and, over a split, attn_<name>/layer_i (and /head_h), and the sink rates."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.statistics import STATISTICS, sink_rate

FINAL = tuple(s for s in STATISTICS if s.final)


def batch_sums(stats: dict, maps: Callable[[], jax.Array], rows_BT, examples) -> dict:
    """{name: (L, N) sum over the batch's examples} of every final statistic and the example count: the blocks'
    per-head statistics (`stats`: the batch's means; the extreme ones where the model computes them) and those read
    from the explicit weights `maps()` (L, B, N, T, S) over the rows `rows_BT` (the task's dormant rows, or every
    valid row), each the mean over the batch's examples that have such rows."""
    sums = {s.name: stats[s.name] * examples for s in FINAL if s.of_maps is None and s.name in stats}
    from_maps = [s for s in FINAL if s.of_maps is not None]
    maps_LBNTS = maps() if from_maps else None
    for s in from_maps:
        sums[s.name] = jnp.nan_to_num(jnp.nanmean(s.of_maps(maps_LBNTS, rows_BT), 1)) * examples
    return {**sums, "examples": examples}


def means(attn: dict) -> dict:
    """{attn_<name>/layer_i: mean over heads} from a split's (L, N) sums and example count (batch_sums, summed); per
    head too where a statistic is final="head"; and each declared rate (Gu et al. 2024's sink rate) per layer
    (attn_<rate>/layer_i) and over every head (attn_<rate>)."""
    examples = jnp.maximum(attn["examples"], 1)
    present = [s for s in FINAL if s.name in attn]
    out = {
        f"attn_{s.name}/layer_{i}": attn[s.name][i].mean() / examples
        for s in present
        for i in range(attn[s.name].shape[0])
    }
    for s in [s for s in present if s.final == "head"]:
        value_LN = attn[s.name] / examples
        out.update({f"attn_{s.name}/layer_{i}/head_{h}": value_LN[i, h] for i, h in np.ndindex(value_LN.shape)})
    for s in [s for s in present if s.rate]:
        rate_L = sink_rate(attn[s.name] / examples)
        out.update({f"attn_{s.rate}/layer_{i}": rate_L[i] for i in range(rate_L.shape[0])})
        out[f"attn_{s.rate}"] = rate_L.mean()  # every layer has the same number of heads
    return out
