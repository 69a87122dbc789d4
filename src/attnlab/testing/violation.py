"""The one exception every contract checker raises."""

from __future__ import annotations


class ContractViolation(AssertionError):
    """A component breaks its contract: one line, `<group>=<name>: <property>: <what> at <sizes and setting>`."""


def fail(subject: str, prop: str, what: str, where: str = "") -> ContractViolation:
    """The violation of `prop` by `subject` (e.g. "normalizer=capped"), on one line."""
    line = f"{subject}: {prop}: {what}" + (f" at {where}" if where else "")
    return ContractViolation(" ".join(line.split()))
