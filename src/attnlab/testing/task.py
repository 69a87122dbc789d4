"""check_task: the `Task` contract (attnlab.tasks.base) run on one task."""

from __future__ import annotations


def check_task(make, *, name: str) -> None:
    raise NotImplementedError
