"""Attention normalizers behind one contract (see `Normalizer`); attnlab.config builds them by name from YAML."""

from __future__ import annotations

import importlib
import sys
import types
import warnings

from attnlab.backends.mask import Mask, as_mask, masked_softmax

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

# Names that moved to the config layer, whose aliases here are gone (README, Contract changes): an alias would have
# to import the config layer from the math it builds on. {old name: its name there}, for the error that says so.
REMOVED = {"attend": "attend", "attention_weights": "attention_weights", "build": "normalizer"}
# Modules that moved out, kept importable under their old names for one release with a warning: {old: new}.
BACKENDS = ("mask", "impl", "fused", "blockwise", "softmax_vjp", "pallas_linear", "pallas_sigmoid", "sampled_rows")
MOVED_MODULES = {**{m: f"attnlab.backends.{m}" for m in BACKENDS}, "statistics": "attnlab.statistics"}


def moved_warning(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old name goes in the next release", DeprecationWarning, stacklevel=3)


class MovedModule(types.ModuleType):
    """A module's old name: each attribute read warns and comes from the module's new place."""

    def __init__(self, old: str, new: str):
        super().__init__(old)
        self.moved_to = new

    def __getattr__(self, name: str):
        if name.startswith("__"):  # what tools probe on every module in sys.modules (inspect: __file__)
            raise AttributeError(name)
        moved_warning(self.__name__, self.moved_to)
        return getattr(importlib.import_module(self.moved_to), name)


for _old, _new in MOVED_MODULES.items():
    sys.modules.setdefault(f"{__name__}.{_old}", MovedModule(f"{__name__}.{_old}", _new))


def __getattr__(name: str):
    if name in REMOVED:
        raise AttributeError(
            f"attnlab.normalizers.{name} moved to attnlab.config.{REMOVED[name]} (built from configs/); its alias "
            "here is gone (README, Contract changes)"
        )
    if name in MOVED_MODULES:
        return sys.modules[f"{__name__}.{name}"]
    raise AttributeError(f"module 'attnlab.normalizers' has no attribute {name!r}")
