"""Output heads: each owns its output activation, its loss and its metrics, so the two never mismatch.

Choices live in configs/head/<name>.yaml; attnlab.config builds one by name and checks it against a task.
"""

from __future__ import annotations

from .base import KINDS, Head
from .classification import ScoresMSE, SoftmaxCE
from .regression import MSE, HLGauss, hl_gauss_target

__all__ = [
    "KINDS",
    "MSE",
    "HLGauss",
    "Head",
    "ScoresMSE",
    "SoftmaxCE",
    "hl_gauss_target",
]
