"""Contract checkers a user's pytest can run on their own normalizer, task or head (and attnlab's own tests run on
every shipped one): each raises `ContractViolation`, one line naming the broken property and where it broke.

    from functools import partial
    from attnlab.testing import check_normalizer

    def test_my_normalizer():
        check_normalizer(partial(MyNormalizer, cap=30.0), name="capped")
"""

from __future__ import annotations

from .head import check_head
from .normalizer import check_normalizer
from .settings import IMPL_SETTINGS, MASK_SETTINGS, mask_setting
from .task import check_task
from .violation import ContractViolation

__all__ = [
    "IMPL_SETTINGS",
    "MASK_SETTINGS",
    "ContractViolation",
    "check_head",
    "check_normalizer",
    "check_task",
    "mask_setting",
]
