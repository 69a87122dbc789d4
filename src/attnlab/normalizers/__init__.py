"""Attention normalizers behind one contract (see `Normalizer`); attnlab.config builds them by name from YAML."""

from __future__ import annotations

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
from .entmax import Entmax, entmax
from .exponential import KL, Softmax, Softmax1
from .linear import Linear
from .mask import Mask, as_mask, masked_softmax
from .pointwise import ReLU, Sigmoid
from .scalable import SSMax
from .squared import Squared
from .stickbreaking import StickBreaking

__all__ = [
    "CORE_STATS",
    "KL",
    "Entmax",
    "FROM_ATTENTION",
    "FixedFeatures",
    "InverseTemperature",
    "Linear",
    "Mask",
    "Normalizer",
    "NormalizerParam",
    "ReLU",
    "SSMax",
    "ScoreNormalizer",
    "Sigmoid",
    "Softmax",
    "Softmax1",
    "Squared",
    "StickBreaking",
    "as_mask",
    "core_stats",
    "entmax",
    "masked_softmax",
    "softmax_stats",
]
