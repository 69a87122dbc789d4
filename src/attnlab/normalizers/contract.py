"""The normalizer contract checked where it can be: members at class definition, options against the YAML.

`check_members` runs from `Normalizer.__init_subclass__`, so a half-implemented normalizer fails
on import, not in the middle of a run with silently wrong statistics; a YAML's options are checked
against the constructor when it is built (attnlab.config.construct).
"""

from __future__ import annotations

import inspect

# What attention passes to every normalizer (the Normalizer contract): arguments, not YAML keys.
FROM_ATTENTION = ("num_heads", "head_dim", "rngs")


def _inherited(cls, member: str, base) -> bool:
    return getattr(cls, member) is getattr(base, member)


def takes_positions(cls) -> bool:
    """Whether `normalize` takes query positions besides (z, mask): its logits depend on position (KL's prior)."""
    return len(inspect.signature(cls.normalize).parameters) > 3


def check_members(cls, normalizer_base, score_base) -> None:
    """Refuse a concrete normalizer class that leaves a contract member unimplemented (Normalizer and
    ScoreNormalizer, given by base.py, which calls this as each class is defined)."""
    missing = [m for m in ("__call__", "weights") if _inherited(cls, m, normalizer_base)]
    if cls.takes_layer_index and _inherited(cls, "set_layer_index", normalizer_base):
        missing.append("set_layer_index (it takes_layer_index)")
    if issubclass(cls, score_base):
        if _inherited(cls, "normalize", score_base):
            missing.append("normalize")
        elif takes_positions(cls) and _inherited(cls, "normalize_rows", score_base):
            # Without it, sampled rows (sampled_rows.py) would be normalised at positions 0..R-1.
            missing.append("normalize_rows (its normalize takes query positions)")
    if missing:
        raise TypeError(
            f"normalizer {cls.__name__} does not implement {', '.join(missing)} "
            f"(the contract: attnlab.normalizers.base.Normalizer)"
        )
