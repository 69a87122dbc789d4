"""Attention normalizers behind one contract (see `Normalizer`); attnlab.config builds them by name from YAML."""

from __future__ import annotations

import warnings

from .base import (
    CORE_STATS,
    FixedFeatures,
    InverseTemperature,
    Normalizer,
    NormalizerParam,
    ScoreNormalizer,
    core_stats,
    softmax_stats,
)
from .contract import FROM_ATTENTION
from .differential import Differential
from .entmax import Entmax, entmax
from .exponential import KL, Softmax, Softmax1
from .forgetting import Forgetting
from .linear import Linear
from .mask import Mask, as_mask, masked_softmax
from .pointwise import ReLU, Sigmoid
from .scalable import SSMax
from .sink import Sink
from .softpick import Softpick
from .squared import Squared
from .stickbreaking import StickBreaking

__all__ = [
    "CORE_STATS",
    "KL",
    "Differential",
    "Entmax",
    "FROM_ATTENTION",
    "FixedFeatures",
    "Forgetting",
    "InverseTemperature",
    "Linear",
    "Mask",
    "Normalizer",
    "NormalizerParam",
    "ReLU",
    "SSMax",
    "ScoreNormalizer",
    "Sigmoid",
    "Sink",
    "Softmax",
    "Softmax1",
    "Softpick",
    "Squared",
    "StickBreaking",
    "as_mask",
    "core_stats",
    "entmax",
    "masked_softmax",
    "softmax_stats",
]

# Names that moved to the config layer, kept here for one release with a warning: {old name: its name there}.
MOVED = {"attend": "attend", "attention_weights": "attention_weights", "build": "normalizer"}


def __getattr__(name: str):
    if name in MOVED:
        from attnlab import config

        new = f"attnlab.config.{MOVED[name]}"
        warnings.warn(
            f"attnlab.normalizers.{name} moved to {new} (built from configs/); the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(config, MOVED[name])
    raise AttributeError(f"module 'attnlab.normalizers' has no attribute {name!r}")
