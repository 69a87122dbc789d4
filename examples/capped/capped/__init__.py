"""A user's components for attnlab: a soft-capped softmax, a majority-vote task and a label-smoothed head."""

from capped.majority import Majority
from capped.smoothed import SmoothedCE
from capped.softcap import CappedSoftmax

__all__ = ["CappedSoftmax", "Majority", "SmoothedCE"]
