"""Tasks: datasets with train/val/test splits and their description (see `Task` for the contract)."""

from __future__ import annotations

from attnlab import registry
from attnlab.tasks.base import Split, Task
from attnlab.tasks.digits import Digits
from attnlab.tasks.icl_regression import ICLRegression
from attnlab.tasks.listops import ListOps
from attnlab.tasks.lm import LanguageModel
from attnlab.tasks.max_retrieval import MaxRetrieval
from attnlab.tasks.mqar import MQAR

__all__ = ["Task", "Split", "make", "MQAR", "ListOps", "ICLRegression", "Digits", "LanguageModel", "MaxRetrieval"]


def make(name: str, **options) -> Task:
    """Build task `name` from configs/task/<name>.yaml, with options overriding its defaults."""
    cls, opts = registry.options("task", name, **options)
    return cls(**opts)
