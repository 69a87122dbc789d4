"""What a language model writes: the shown example's first bytes continued greedily, for the Text tab."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

MAX_NEW = 64  # bytes written per sample: one forward pass each, on eval steps only
MAX_CONTEXT = (
    256  # the sample runs on the shown example's first ≤ 256 positions: 64 passes at T=1024 cost ~5 val batches
)


def sample_length(seq_len: int) -> int:
    """Positions the sample runs on: min(seq_len, MAX_CONTEXT) (a causal model's prefix is a valid input)."""
    return min(seq_len, MAX_CONTEXT)


def prompt_length(length: int) -> int:
    """Of a sample of `length` positions, the first length - min(64, length // 2) bytes are the prompt."""
    return length - min(MAX_NEW, length // 2)


def make_continuation(graphdef, *, seq_len: int):
    """(params, rest, inputs_1T, valid_1T) -> (1, L) inputs of one seed, L = sample_length(T), whose positions
    from prompt_length(L) on are the model's greedy choice, each from the positions before it (a causal model
    never sees the rest, so the shown example's first L positions are a complete input)."""
    length = sample_length(seq_len)
    start = prompt_length(length)

    def write(params, rest, inputs_1T, valid_1T):
        net = nnx.merge(graphdef, params, rest)
        valid_1L = valid_1T[:, :length]

        def next_byte(t, tokens_1L):
            logits_1LC = net.head(net.body(tokens_1L, valid_1L)[0])
            # targets are bytes 0..255, inputs byte + 1 (0 is padding)
            return tokens_1L.at[0, t].set((jnp.argmax(logits_1LC[0, t - 1]) + 1).astype(tokens_1L.dtype))

        return jax.lax.fori_loop(start, length, next_byte, inputs_1T[:, :length])

    return write
