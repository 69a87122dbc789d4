"""Tasks: datasets with train/val/test splits and their description (see `Task` for the contract)."""

from __future__ import annotations

from attnlab.tasks.base import Split, Task
from attnlab.tasks.bigram_backcopy import BigramBackcopy
from attnlab.tasks.digits import Digits
from attnlab.tasks.icl_regression import ICLRegression
from attnlab.tasks.lengths import length_tasks
from attnlab.tasks.listops import ListOps
from attnlab.tasks.lm import LanguageModel
from attnlab.tasks.max_retrieval import MaxRetrieval
from attnlab.tasks.mqar import MQAR

__all__ = [
    "Task",
    "Split",
    "with_test_lengths",
    "MQAR",
    "ListOps",
    "ICLRegression",
    "Digits",
    "LanguageModel",
    "MaxRetrieval",
    "BigramBackcopy",
]


def with_test_lengths(task: Task, test_lengths) -> Task:
    """The task with `at_lengths`, its rebuilds at each of task.test_lengths (tasks.lengths)."""
    task.at_lengths = length_tasks(task, test_lengths)
    return task
