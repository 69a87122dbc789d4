"""A user's package written to the contract of the release before this one (tests/config/test_previous_release.py):
the next contract change must keep it working, with a DeprecationWarning, for a release."""

from .components import FirstToken, HalvedSoftmax, PlainCE

__all__ = ["FirstToken", "HalvedSoftmax", "PlainCE"]
