"""check_head: the `Head` contract (attnlab.heads.base) run on one head."""

from __future__ import annotations


def check_head(make, *, name: str) -> None:
    raise NotImplementedError
