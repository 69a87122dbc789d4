"""Tasks: datasets with train/val/test splits and their description (see `Task` for the contract)."""

from __future__ import annotations

from attnlab import construct, registry
from attnlab.tasks.base import Split, Task
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
    "build",
    "make",
    "MQAR",
    "ListOps",
    "ICLRegression",
    "Digits",
    "LanguageModel",
    "MaxRetrieval",
]


def make(name: str, **options) -> Task:
    """Build task `name` from configs/task/<name>.yaml, with options overriding its defaults."""
    return build({**registry.load("task", name), **options})


def build(node: dict) -> Task:
    """A task from its composed config node; `test_lengths` adds its rebuilds at other lengths (tasks.lengths)."""
    return with_test_lengths(construct.build("task", node, read=("test_lengths",)), node.get("test_lengths"))


def with_test_lengths(task: Task, test_lengths) -> Task:
    """The task with `at_lengths`, its rebuilds at each of task.test_lengths (tasks.lengths)."""
    task.at_lengths = length_tasks(task, test_lengths)
    return task
