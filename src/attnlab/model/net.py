"""The model a run trains: the transformer body and its output head, one nnx module."""

from __future__ import annotations

from flax import nnx


class Net(nnx.Module):
    """The transformer body and its output head."""

    def __init__(self, body, head):
        self.body, self.head = body, head
