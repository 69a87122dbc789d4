"""Cross-entropy with label smoothing (Szegedy et al. 2016, Sec. 7): the target puts ε on the classes uniformly."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnlab.checks import real
from attnlab.heads import SoftmaxCE
from attnlab.heads.base import upcast


class SmoothedCE(SoftmaxCE):
    """SoftmaxCE trained towards (1 − ε)·one-hot + ε/C; its metrics (nll included) are SoftmaxCE's."""

    loss_is_nll = False  # the loss is no longer the nll of the labels

    def __init__(self, *, d_model, num_classes, rngs, smoothing=0.1, ece_bins=15):
        super().__init__(d_model=d_model, num_classes=num_classes, rngs=rngs, ece_bins=ece_bins)
        self.smoothing = real("head.smoothing", smoothing, 0.0, 1.0, hi_open=True)

    def loss(self, outputs_XC, targets_X, weights_X):
        logp_XC = jax.nn.log_softmax(upcast(outputs_XC), axis=-1)
        weights_X = upcast(weights_X)
        onehot_XC = jax.nn.one_hot(self._targets(targets_X, weights_X), self.num_classes)
        target_XC = (1 - self.smoothing) * onehot_XC + self.smoothing / self.num_classes
        per_position_X = -(target_XC * logp_XC).sum(-1)
        return (weights_X * per_position_X).sum() / jnp.maximum(weights_X.sum(), 1)
