"""The value checks every component uses: each failure is one line, `group.key=value is invalid; allowed: ...`."""

from __future__ import annotations

import math
from typing import Any, Iterable


class ConfigError(ValueError):
    """Bad user input, refused in one line (exit 2). Only this is a refusal: any other exception while building
    a run is a bug, reported as a failed run with its traceback. A ValueError, so callers catching that still work."""


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def require(ok: bool, message: str, error: type[Exception] = ConfigError) -> None:
    """Raise `error(message)` unless ok: for checks whose message no helper below writes."""
    if not ok:
        raise error(message)


def integer(key: str, value, lo: int, hi: int | None = None) -> int:
    """An integer in [lo, hi], else ConfigError `key=value is invalid; allowed: ...`."""
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        allowed = f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "")
        raise ConfigError(f"{key}={value!r} is invalid; allowed: {allowed}")
    return value


def real(key: str, value, lo: float = -math.inf, hi: float = math.inf, *, lo_open=False, hi_open=False) -> float:
    """A finite number in the interval, else ConfigError naming the interval."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        bounds = [
            f"{'>' if lo_open else '>='} {lo}" if lo > -math.inf else "",
            f"{'<' if hi_open else '<='} {hi}" if hi < math.inf else "",
        ]
        raise ConfigError(
            f"{key}={value!r} is invalid; allowed: a finite number {' and '.join(b for b in bounds if b)}"
        )
    return float(value)


def boolean(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} is invalid; allowed: true or false")
    return value


def _yaml(value) -> str:
    """A value as the YAML configs spell it (null, true, false)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def choice(key: str, value, allowed: Iterable[Any]) -> Any:
    allowed = list(allowed)
    if value not in allowed or isinstance(value, bool) != any(isinstance(a, bool) for a in allowed if a == value):
        raise ConfigError(f"{key}={value!r} is invalid; allowed: {', '.join(_yaml(a) for a in allowed)}")
    return value
