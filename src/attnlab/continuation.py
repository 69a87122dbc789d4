"""What a language model writes: the probe example's first bytes continued greedily, for the Text tab."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.steps import over_seeds

MAX_NEW = 64  # bytes written per sample: one forward pass each, on eval steps only


def prompt_length(seq_len: int) -> int:
    """The probe's first seq_len - min(64, seq_len // 2) bytes are the prompt; the rest is written."""
    return seq_len - min(MAX_NEW, seq_len // 2)


def make_continuation(graphdef, *, seq_len: int, num_seeds: int = 1):
    """(params, rest, inputs_1T, valid_1T) -> (S, 1, T) inputs whose positions from prompt_length(T) on are
    the model's greedy choice, each from the positions before it (a causal model never sees the rest)."""
    start = prompt_length(seq_len)

    def write(params, rest, inputs_1T, valid_1T):
        net = nnx.merge(graphdef, params, rest)

        def next_byte(t, tokens_1T):
            logits_1TC = net.head(net.body(tokens_1T, valid_1T)[0])
            # targets are bytes 0..255, inputs byte + 1 (0 is padding)
            return tokens_1T.at[0, t].set((jnp.argmax(logits_1TC[0, t - 1]) + 1).astype(tokens_1T.dtype))

        return jax.lax.fori_loop(start, seq_len, next_byte, inputs_1T)

    return jax.jit(over_seeds(write, num_seeds, (0, 0, None, None)))
