"""The sizes and mask settings check_normalizer runs a normalizer at: cross and causal attention, left and right
padding, rows with no admissible key, windows and an explicit mask, for the forward properties and for each
implementation's comparison with the dense form."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from attnlab.backends.mask import Mask
from attnlab.normalizers import reference as ref

B, N, H = 2, 3, 5  # small on purpose: the whole check of one normalizer takes seconds on a CPU
BLOCK = 4  # block size of blockwise forms and chunk size of linear attention's chunked form: several per sequence


@dataclasses.dataclass(frozen=True)
class Setting:
    """A mask setting: T queries, S keys (the queries are the last T), key padding, an explicit mask, causal, window."""

    name: str
    T: int
    S: int
    key_valid_BS: np.ndarray | None = None
    dense_BTS: np.ndarray | None = None
    causal: bool = False
    window: int | None = None

    def mask(self) -> Mask:
        valid = self.key_valid_BS
        prefix = valid is not None and all(valid[b].sum() == valid[b, : valid[b].sum()].sum() for b in range(B))
        return Mask(
            key_valid_BS=None if valid is None else jnp.asarray(valid),
            dense_BTS=None if self.dense_BTS is None else jnp.asarray(self.dense_BTS),
            causal=self.causal,
            window=self.window,
            right_padded=bool(prefix),
        )

    def admissible(self) -> np.ndarray:
        """(B,T,S) bool, in numpy from the setting's own arrays (not from Mask)."""
        return ref.admissible(B, self.T, self.S, self.key_valid_BS, self.dense_BTS, self.causal, self.window)

    def padded_BS(self) -> np.ndarray:
        return np.zeros((B, self.S), bool) if self.key_valid_BS is None else ~self.key_valid_BS

    def where(self, **more) -> str:
        extra = "".join(f" {k}={v}" for k, v in more.items())
        return f"B={B} N={N} H={H} T={self.T} S={self.S} mask={self.name}{extra}"


def _valid(S, *rows):
    """(B, S) key_valid: row b keeps the keys not listed in rows[b]."""
    out = np.ones((B, S), bool)
    for b, drop in enumerate(rows):
        out[b, list(drop)] = False
    return out


def _dense():
    dense = np.random.default_rng(101).random((B, 7, 11)) < 0.6
    dense[0, 2] = False
    dense[1, 4] = False
    dense[1, 4, 6] = True  # a row with a single admissible key
    return dense


# none/pad: cross attention T=7, S=11; causal_pad: T=S=13 with right padding (batch 0) and left padding (batch 1, so
# its first rows have no admissible key); causal_cross: T=7 < S=11 causal (queries are the last T); dense: an explicit
# random mask with an empty row and a one-key row, plus padding; grad: T=S=13 causal with padding but no empty row.
MASK_SETTINGS = {
    s.name: s
    for s in (
        Setting("none", 7, 11),
        Setting("pad", 7, 11, _valid(11, range(8, 11), (0, 4, 5))),
        Setting("causal_pad", 13, 13, _valid(13, (11, 12), (0, 1, 2, 7)), causal=True),
        Setting("causal_cross", 7, 11, causal=True),
        Setting("dense", 7, 11, _valid(11, (), (9, 10)), _dense()),
        Setting("grad", 13, 13, _valid(13, (10, 11, 12), (2, 7)), causal=True),
    )
}
FORWARD_SETTINGS = ("none", "pad", "causal_pad", "causal_cross", "dense")
EMPTY_ROW_SETTINGS = ("causal_pad", "dense")
# Where each implementation is compared with the dense form: T ≠ S and T not a multiple of the block, left and right
# padding, rows with no admissible key, windows, an explicit mask. An implementation that cannot express a setting
# (the fused kernels: a causal T ≠ S) refuses it with a ConfigError and is compared on the others.
IMPL_SETTINGS = {
    s.name: s
    for s in (
        Setting("causal_pad_cross", 10, 13, _valid(13, range(5), range(10, 13)), causal=True),
        Setting("causal_right_pad", 12, 12, _valid(12, (), range(8, 12)), causal=True),
        Setting("causal_window", 11, 11, _valid(11, (), (9, 10)), causal=True, window=3),
        Setting("window_dense", 9, 7, dense_BTS=np.random.default_rng(7).random((B, 9, 7)) < 0.7, window=4),
        Setting("cross", 6, 9),
    )
}
# The settings each implementation runs at (any other: all of them): those where it takes a path of its own.
IMPL_RUNS = {
    "blockwise": ("causal_pad_cross", "causal_window", "window_dense"),
    "xla": ("causal_window", "cross"),  # the fused kernel takes right padding, and causal masks at T = S only
    "chunked": ("causal_right_pad",),  # linear attention's O(T) causal form: T = S, no window, no explicit mask
    "auto": ("cross",),  # linear attention's bidirectional form
}


def mask_setting(name: str) -> tuple[int, int, Mask, np.ndarray]:
    """(T, S, Mask, admissible (B,T,S) numpy bool) of a named setting of MASK_SETTINGS or IMPL_SETTINGS."""
    s = MASK_SETTINGS.get(name) or IMPL_SETTINGS[name]
    return s.T, s.S, s.mask(), s.admissible()


def qkv(seed: int, T: int, S: int, scale: float = 1.0):
    """float32 heads-major q (B,N,T,H), k, v (B,N,S,H) from normal draws."""
    rng = np.random.default_rng(seed)
    q = (scale * rng.normal(size=(B, N, T, H))).astype(np.float32)
    k = rng.normal(size=(B, N, S, H)).astype(np.float32)
    v = rng.normal(size=(B, N, S, H)).astype(np.float32)
    return q, k, v
