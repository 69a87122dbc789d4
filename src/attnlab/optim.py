"""AdamW or SGD under warmup + cosine decay with global-norm clipping; normalizer parameters are not decayed."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from attnlab.normalizers import NormalizerParam
from attnlab.options import optim as optim_options


def decay_mask(params: nnx.State):
    """True for weight matrices; False for biases, norm scales (LayerNorm, the QK-norm gain) and every
    NormalizerParam (β, priors, slopes).

    Decay on a raw β would pull it towards 0, and so every attention row towards uniform.
    """
    variables = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    flags = [not isinstance(v, NormalizerParam) and v[...].ndim >= 2 for v in variables]
    return jax.tree.unflatten(jax.tree.structure(params), flags)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
    """optax.clip_by_global_norm (the same state and arithmetic) that takes the norm as `grad_norm=` when
    the step has computed it already: a second reduction of every gradient leaf is a kernel per leaf on a GPU."""

    def update(updates, state, params=None, *, grad_norm=None, **extra_args):
        del params, extra_args
        g_norm = optax.tree.norm(updates) if grad_norm is None else grad_norm
        trigger = g_norm < max_norm
        return jax.tree.map(
            lambda t: jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm), updates
        ), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.ClipByGlobalNormState(), update)


def warmup_cosine(count, peak_lr, warmup_steps, total_steps, final_fraction) -> jax.Array:
    """Linear warmup to peak_lr, then cosine decay to final_fraction·peak_lr at total_steps (optax's
    warmup_cosine_decay_schedule). Every argument may be an array, so the rate's constants can live in the optimizer
    state: runs that differ only in them share one compiled step."""
    warmup = jnp.maximum(warmup_steps, 1).astype(jnp.float32)
    total = jnp.maximum(total_steps, warmup + 1).astype(jnp.float32)
    count = jnp.asarray(count, jnp.float32)
    progress = jnp.clip((count - warmup) / (total - warmup), 0.0, 1.0)
    cosine = peak_lr * ((1 - final_fraction) * 0.5 * (1 + jnp.cos(jnp.pi * progress)) + final_fraction)
    return jnp.where(count < warmup, peak_lr * count / warmup, cosine)


def schedule(lr: float, warmup_steps: int, total_steps: int, final_fraction: float = 0.1):
    """count -> the rate of warmup_cosine with these constants."""
    return functools.partial(
        warmup_cosine, peak_lr=lr, warmup_steps=warmup_steps, total_steps=total_steps, final_fraction=final_fraction
    )


class RateState(NamedTuple):
    """scale_by_rate's state: the updates applied so far, and the rate of the last one (what opt/lr logs)."""

    count: jax.Array
    learning_rate: jax.Array


def scale_by_rate(rate: Callable[[jax.Array], jax.Array]) -> optax.GradientTransformation:
    """Updates of a rule at rate 1 (its sign applied) times rate(count), the applied rate kept in the state."""

    def init(params):
        del params
        return RateState(jnp.zeros([], jnp.int32), jnp.asarray(rate(0), jnp.float32))

    def update(updates, state, params=None):
        del params
        lr = jnp.asarray(rate(state.count), jnp.float32)
        updates = jax.tree.map(lambda u: u * lr.astype(u.dtype), updates)
        return updates, RateState(optax.safe_increment(state.count), lr)

    return optax.GradientTransformation(init, update)


def make_optimizer(
    params: nnx.State,
    *,
    lr: float,
    warmup_steps: int,
    total_steps: int,
    weight_decay: float,
    clip_norm: float,
    b1: float,
    b2: float,
    final_fraction: float = 0.1,
):
    """optax chain: clip by global norm, then AdamW with the decay mask and schedule (optim=adamw)."""
    opts = dict(weight_decay=weight_decay, b1=b1, b2=b2, final_fraction=final_fraction)
    return AdamW(lr=lr, warmup_steps=warmup_steps, clip_norm=clip_norm, **opts)(params, total_steps)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """The `optim` group's contract (configs/optim/<name>.yaml's `_target_` subclasses it): the values every
    optimizer shares, checked when built; called with the parameters and the run's length, it is the optax chain
    clip by global norm → `update_rule(params)(learning_rate=1.0, **hyperparams())` → the warmup-cosine rate.

    The rate comes last, as in optax's own AdamW and SGD (their updates end in scale_by_learning_rate), so the
    chain's updates are those of the rule at the scheduled rate. The rate's constants, the clip and `hyperparams()`
    are arrays of the optimizer state (optax.inject_hyperparams), not constants of the compiled step: a sweep over
    them compiles one program."""

    lr: float
    warmup_steps: int
    clip_norm: float
    final_fraction: float = 0.1

    def __post_init__(self):
        optim_options.optimizer(
            lr=self.lr, warmup_steps=self.warmup_steps, clip_norm=self.clip_norm, final_fraction=self.final_fraction
        )

    def update_rule(self, params: nnx.State) -> Callable[..., optax.GradientTransformation]:
        """(learning_rate, **hyperparams()) -> the optax transformation after the clip, its rate last."""
        raise NotImplementedError

    def hyperparams(self) -> dict[str, float]:
        """The update rule's numeric options that change no shape, passed to it as values; {}: none."""
        return {}

    def injected(self) -> dict[str, float]:
        """The options that enter the compiled step as arrays of the optimizer state, not as constants."""
        shared = dict(
            lr=self.lr, warmup_steps=self.warmup_steps, final_fraction=self.final_fraction, clip_norm=self.clip_norm
        )
        return {**shared, **self.hyperparams()}

    def __call__(self, params: nnx.State, total_steps: int):
        rule = self.update_rule(params)
        values = {**self.injected(), "total_steps": total_steps}

        def chain(lr, warmup_steps, total_steps, final_fraction, clip_norm, **options):
            rate = schedule(lr, warmup_steps, total_steps, final_fraction)
            return optax.chain(clip_by_global_norm(clip_norm), rule(learning_rate=1.0, **options), scale_by_rate(rate))

        # inject_hyperparams reads the factory's signature to find its numeric arguments.
        chain.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in values])
        return optax.inject_hyperparams(chain)(**values)


@dataclasses.dataclass(frozen=True)
class AdamW(Optimizer):
    """optim=adamw: make_optimizer's chain (AdamW with the decay mask)."""

    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.98

    def __post_init__(self):
        super().__post_init__()
        optim_options.adamw(weight_decay=self.weight_decay, b1=self.b1, b2=self.b2)

    def hyperparams(self):
        return {"weight_decay": self.weight_decay, "b1": self.b1, "b2": self.b2}

    def update_rule(self, params):
        return functools.partial(optax.adamw, mask=decay_mask(params))


@dataclasses.dataclass(frozen=True)
class SGD(Optimizer):
    """optim=sgd: SGD with (heavy-ball or Nesterov) momentum and masked weight decay, under the same schedule and
    clip as AdamW; Guo et al. 2024 (arXiv 2410.13835, Sec. 4) find that SGD, unlike Adam, does not
    grow the residual-state peak of the attention-sink token."""

    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        optim_options.sgd(momentum=self.momentum, nesterov=self.nesterov, weight_decay=self.weight_decay)

    def hyperparams(self):
        return {"weight_decay": self.weight_decay}

    def update_rule(self, params):
        mask = decay_mask(params)

        def sgd(learning_rate, weight_decay):
            # Weight decay joins the gradient before the momentum, as in torch.optim.SGD's weight_decay.
            return optax.chain(
                optax.add_decayed_weights(weight_decay, mask),
                optax.sgd(learning_rate, momentum=self.momentum or None, nesterov=self.nesterov),
            )

        return sgd


def current_lr(opt_state) -> jax.Array:
    """The learning rate of the last update, read from scale_by_rate's state."""
    states = [
        s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, RateState)) if isinstance(s, RateState)
    ]
    return states[0].learning_rate
