"""How an lm step draws its windows of the training text: on the device from the resident text (`TextWindows`),
or, for a text over task.device_text_bytes (`train_data: host-stream`), streamed from the host (`HostStream`):
a memory-mapped file, each step's windows gathered on the host by a prefetching grain loader.

The offsets are one formula for both paths (`window_starts`): the device path traces it inside the step
(TextWindows.draw), the host path evaluates it on the CPU backend for the same (seed key, step), so the
windows are byte for byte the same and a resumed run replays them. Offsets past 2^31 (a text over 2 GiB,
which only the host path holds) come from two 32-bit draws combined in 64-bit numpy on the host.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.checks import ConfigError
from attnlab.tasks.base import INT32_MAX
from attnlab.tasks.batches import Resident, key_at

BOS_SYMBOL = 256  # task.bos over bytes: the stream symbol opening each document (the bytes are 0-255)
BOS = BOS_SYMBOL + 1  # its input id (a byte b is input id b + 1, 0 is padding)


def window_starts(key, batch_size: int, span: int):
    """batch_size window offsets, uniform in [0, span), from the step's key: the device path's formula.

    span = text bytes − window + 1 is static. JAX has no int64 with x64 off, so the device path stops
    at INT32_MAX (task.device_text_bytes cannot exceed it); the host path goes further (host_starts).
    """
    if span > INT32_MAX:
        raise ConfigError(
            f"a training text of {span} windows cannot be indexed on the device (int32 offsets, "
            f"at most {INT32_MAX}); lower task.device_text_bytes so that it streams from the host"
        )
    return jax.random.randint(key, (batch_size,), 0, span)


def wide_bits(key, batch_size: int):
    """Two independent uint32 draws per window (high, low): the parts of a 64-bit offset beyond int32."""
    k_hi, k_lo = jax.random.split(key)
    return jax.random.bits(k_hi, (batch_size,), jnp.uint32), jax.random.bits(k_lo, (batch_size,), jnp.uint32)


def combine_wide(hi, lo, span: int) -> np.ndarray:
    """(hi·2^32 + lo) mod span in uint64: uniform over [0, span) up to a bias below span / 2^64."""
    return ((np.asarray(hi, np.uint64) << np.uint64(32) | np.asarray(lo, np.uint64)) % np.uint64(span)).astype(np.int64)


@functools.partial(jax.jit, static_argnames=("batch_size", "span"))
def _draw_S(key_data_S2, step, *, batch_size: int, span: int):
    """Per seed: the key of step `step` (steps.step_key) and its offsets, or its wide bits past int32."""

    def one(key_data):
        key = key_at(key_data, step)
        return window_starts(key, batch_size, span) if span <= INT32_MAX else wide_bits(key, batch_size)

    return jax.vmap(one)(key_data_S2)


def host_starts(key_data_S2, step: int, batch_size: int, span: int) -> np.ndarray:
    """(S, batch_size) int64 offsets of step `step` (the state's step count before the update) per seed key."""
    cpu = jax.devices("cpu")[0]
    out = _draw_S(jax.device_put(np.asarray(key_data_S2), cpu), np.int32(step), batch_size=batch_size, span=span)
    if span <= INT32_MAX:
        return np.asarray(out, np.int64)
    return combine_wide(*out, span)


def text_batch(win_BW):
    """Windows of seq_len + 1 tokens (bytes, or subword ids) as a batch: inputs are token + 1 (0 is padding),
    targets the next token."""
    ones_BT = jnp.ones(win_BW[:, 1:].shape)
    return {
        "inputs": win_BW[:, :-1] + 1,
        "targets": win_BW[:, 1:],
        "weights": ones_BT.astype(jnp.float32),
        "valid": ones_BT.astype(bool),
    }


@dataclasses.dataclass(frozen=True)
class TextWindows(Resident):
    """The training text on the device (uint8 bytes, or a subword tokenizer's ids) and a window's offsets
    0..seq_len: a step's windows start at uniform offsets over the whole text, so every token can be seen and the
    memory is the text's, not n_windows × seq_len."""

    text: jax.Array
    window_W: jax.Array

    def draw(self, key, batch_size: int) -> dict:
        start_B = window_starts(key, batch_size, self.text.shape[0] - self.window_W.shape[0] + 1)
        return text_batch(self.text[start_B[:, None] + self.window_W[None]].astype(jnp.int32))


def bos_batch_arrays(win_BW, xp, bos_symbol: int = BOS_SYMBOL):
    """(inputs, targets, weights, valid) of windows of seq_len + 1 symbols under task.bos: inputs are the symbols
    + 1 with the first replaced by BOS (bos_symbol + 1); targets the next symbols, a BOS among them a placeholder 0
    of weight 0. bos_symbol is the one past the tokens' (256 for bytes, the vocabulary size for subwords)."""
    inputs = xp.concatenate([xp.full_like(win_BW[:, :1], bos_symbol + 1), win_BW[:, 1:-1] + 1], axis=1)
    nxt = win_BW[:, 1:]
    token = nxt != bos_symbol
    return inputs, xp.where(token, nxt, 0), token.astype(xp.float32), xp.ones(nxt.shape, bool)


@dataclasses.dataclass(frozen=True)
class BosTextWindows(TextWindows):
    """task.bos: the packed training stream (uint16 or int32 symbols, bos_symbol at each document start) on the
    device; a step's windows as TextWindows draws them, each opened by BOS (bos_batch_arrays)."""

    bos_symbol: int = BOS_SYMBOL

    def draw(self, key, batch_size: int) -> dict:
        start_B = window_starts(key, batch_size, self.text.shape[0] - self.window_W.shape[0] + 1)
        win_BW = self.text[start_B[:, None] + self.window_W[None]].astype(jnp.int32)
        return dict(zip(("inputs", "targets", "weights", "valid"), bos_batch_arrays(win_BW, jnp, self.bos_symbol)))


@dataclasses.dataclass(frozen=True)
class Windows:
    """One step's (B, seq_len + 1) bytes, gathered by the host at the offsets TextWindows would draw."""

    windows: jax.Array

    def draw(self, key, batch_size: int) -> dict:
        return text_batch(self.windows.astype(jnp.int32))


jax.tree_util.register_dataclass(TextWindows, data_fields=["text", "window_W"], meta_fields=[])
jax.tree_util.register_dataclass(BosTextWindows, data_fields=["text", "window_W"], meta_fields=["bos_symbol"])
jax.tree_util.register_dataclass(Windows, data_fields=["windows"], meta_fields=[])


class HostStream:
    """Each step's windows (S, B, window) uint8, gathered from a memory-mapped text and prefetched by grain.

    `next()` gives the data of the next step from `start` on (state steps start, start + 1, ..., stop − 1)
    as Windows of a device array, placed with `sharding` (the per-seed placement). The host holds only the
    map (pages the OS reads in and may drop) and a few prefetched batches, never a copy of the text.
    """

    streamed = True

    def __init__(
        self,
        text_U8: np.ndarray,
        window: int,
        key_data_S2,
        batch_size: int,
        sharding=None,
        *,
        start: int = 0,
        stop: int | None = None,
        prefetch: int = 4,
        threads: int = 2,
    ):
        self.text, self.window, self.batch_size, self.sharding = text_U8, window, batch_size, sharding
        self.span = len(text_U8) - window + 1
        self.keys = np.asarray(jax.device_get(key_data_S2))
        self.start, self.stop, self.prefetch, self.threads = start, stop, prefetch, threads
        self._it = None

    def windows(self, step: int, keys=None) -> np.ndarray:
        """The (S, B, window) bytes of state step `step` for each seed key (default: the run's), one gather
        from a strided view of the map: a copy of S·B·window bytes, never of the text."""
        keys = self.keys if keys is None else np.asarray(jax.device_get(keys))
        starts_SB = host_starts(keys, step, self.batch_size, self.span)
        return np.lib.stride_tricks.sliding_window_view(self.text, self.window)[starts_SB]

    def spec(self) -> Windows:
        """The step's data argument, abstract (to compile the step before any batch is read)."""
        shape = (len(self.keys), self.batch_size, self.window)
        return Windows(jax.ShapeDtypeStruct(shape, jnp.uint8, sharding=self.sharding))

    def for_step(self, step: int, key_data) -> Windows:
        """The windows one seed (raw key data `key_data`) drew at state step `step`, gathered again."""
        return Windows(self.windows(step, np.asarray(key_data)[None])[0])

    def next(self) -> Windows:
        """The next step's windows on the device; the loader starts (prefetching) on the first call."""
        if self._it is None:
            import grain  # only a host-stream run pays for the import

            stop = self.stop if self.stop is not None else INT32_MAX
            loader = grain.MapDataset.range(self.start, stop).map(self.windows)
            self._it = iter(
                loader.to_iter_dataset(grain.ReadOptions(num_threads=self.threads, prefetch_buffer_size=self.prefetch))
            )
        win_SBW = next(self._it)
        return Windows(jnp.asarray(win_SBW) if self.sharding is None else jax.device_put(win_SBW, self.sharding))
