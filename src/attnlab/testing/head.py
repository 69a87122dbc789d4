"""check_head: the `Head` contract (attnlab.heads.base) run on one head."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.heads.base import KINDS

from .violation import ContractViolation, fail

D, C = 6, 5  # feature width, classes of a classification head
SHAPES = ((2, 7), (3,))  # token-level (B, T) and sequence-level (B,) leading dims
METRICS = {"classification": {"accuracy", "nll", "ece", "brier"}, "regression": {"mse", "r2"}}


def check_head(make, *, name: str) -> None:
    """Run the `Head` contract on the head `make(d_model=, num_classes=, rngs=)` builds; raise ContractViolation naming
    the first broken property and the leading shape it broke at.

    Sizes: d_model 6; a classification head gets num_classes 5, a regression head None. Properties, in order:

    - construction: `kind` is classification | regression; a classification head refuses num_classes=None and a
      regression head refuses a number.
    - shapes, at leading dims (2, 7) and (3,): outputs (X…, K) (K absent for a scalar regression head); predictions
      X; the loss a scalar; every metric a scalar.
    - activation: `__call__` is one Linear layer's raw outputs, no activation: affine in the features.
    - predictions: a classification head predicts the argmax of `logits(outputs)`, a class in [0, K).
    - weighted mean: the loss under weights w is Σ w·l / max(Σ w, 1) of the per-position losses (each position's loss
      at weight 1), all finite.
    - weight 0: targets at weight-0 positions are never read: garbage there (NaN, out-of-range classes, 1e6) leaves
      loss and metrics unchanged.
    - metrics: the contract's keys (accuracy, nll, ece, brier; mse, r2, and mse_rel given baseline_mse); metric_sums
      of two disjoint halves add up to those of the whole; metrics_from_sums of them is `metrics`.
    - gradients of the loss with respect to the head's parameters are finite and not all zero.
    """
    subject = f"head={name}"
    head, kind = _build(subject, make)
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        where = f"d_model={D} X={shape}"
        _check_shape(subject, head, kind, shape, rng, where)


def _run(subject, prop, where, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ContractViolation:
        raise
    except Exception as exc:  # noqa: BLE001 — any crash of the head is a violation of `prop`
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise fail(subject, prop, f"raised {type(exc).__name__}: {first}", where) from exc


def _build(subject, make):
    """The head and its kind; a head of each kind refuses the other kind's num_classes."""
    where = f"d_model={D}"
    for classes, other in ((C, None), (None, C)):
        try:
            head = make(d_model=D, num_classes=classes, rngs=nnx.Rngs(0))
        except Exception:  # noqa: BLE001, S112 — the other kind of head
            continue
        kind = getattr(head, "kind", None)
        if kind not in KINDS:
            raise fail(subject, "construction", f"kind={kind!r}, allowed: {' | '.join(KINDS)}", where)
        if (kind == "classification") != (classes is not None):
            raise fail(subject, "construction", f"a {kind} head built with num_classes={classes}", where)
        try:
            make(d_model=D, num_classes=other, rngs=nnx.Rngs(0))
        except Exception:  # noqa: BLE001, S110 — the refusal asked for
            return head, kind
        raise fail(subject, "construction", f"a {kind} head took num_classes={other}", where)
    _run(subject, "construction", where, make, d_model=D, num_classes=C, rngs=nnx.Rngs(0))
    raise fail(subject, "construction", "it builds with neither num_classes=5 nor None", where)


class _Jitted:
    """The head's loss and metrics, each one compiled program (op-by-op dispatch is the slow part on a CPU)."""

    def __init__(self, head):
        for name in ("loss", "metrics", "metric_sums", "metrics_from_sums"):
            setattr(self, name, jax.jit(getattr(head, name)))


def _targets(kind, rng, shape):
    return rng.integers(0, C, shape).astype(np.int32) if kind == "classification" else rng.uniform(-3, 3, shape)


def _close(a, b, rtol=1e-5, atol=1e-6):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all((a == b) | (np.abs(a - b) <= atol + rtol * np.abs(b))))


def _check_shape(subject, head, kind, shape, rng, where):  # noqa: C901 — one block per property
    def bad(prop, what):
        return fail(subject, prop, what, where)

    fn = _Jitted(head)
    x1, x2 = (jnp.asarray(rng.normal(size=shape + (D,)), jnp.float32) for _ in range(2))
    out = _run(subject, "shapes", where, head, x1)
    if out.shape[: len(shape)] != shape or out.ndim > len(shape) + 1:
        raise bad("shapes", f"outputs {out.shape}, expected {shape} + (K,)")
    mixed = _run(subject, "shapes", where, head, 0.3 * x1 + 0.7 * x2)
    if not _close(mixed, 0.3 * out + 0.7 * head(x2), rtol=1e-4, atol=1e-5):
        raise bad("activation", "outputs are not affine in the features (an activation inside __call__)")
    pred = _run(subject, "shapes", where, head.predict, out)
    if pred.shape != shape:
        raise bad("shapes", f"predictions {pred.shape}, expected {shape}")
    if kind == "classification":
        logits = _run(subject, "predictions", where, head.logits, out)
        if not np.array_equal(np.asarray(pred), np.argmax(np.asarray(logits), -1)):
            raise bad("predictions", "predict is not the argmax of logits(outputs)")
    y = _targets(kind, rng, shape)
    w = rng.uniform(0.5, 2.0, shape)
    w.flat[::3] = 0.0
    loss = _run(subject, "weighted mean", where, fn.loss, out, y, w)
    if jnp.shape(loss) != ():
        raise bad("shapes", f"the loss has shape {jnp.shape(loss)}, expected ()")
    flat_out, flat_y = out.reshape((-1,) + out.shape[len(shape) :]), y.reshape(-1)
    per = np.asarray(
        jax.jit(jax.vmap(lambda o, t: fn.loss(o[None], t[None], jnp.ones(1))))(flat_out, jnp.asarray(flat_y))
    )
    want = (w.reshape(-1) * per).sum() / max(w.sum(), 1.0)
    if not (np.isfinite(per).all() and _close(loss, want, rtol=2e-5, atol=1e-6)):
        raise bad("weighted mean", f"loss {float(loss):.6g}, Σ w·l / max(Σ w, 1) of its per-position losses {want:.6g}")
    garbage = y.copy()
    zero = w == 0
    if kind == "classification":
        garbage[zero] = np.where(rng.random(zero.sum()) < 0.5, -1, C + 3)
    else:
        garbage[zero] = np.where(rng.random(zero.sum()) < 0.5, np.nan, 1e6)
    metrics = _run(subject, "metrics", where, fn.metrics, out, y, w)
    if float(fn.loss(out, garbage, w)) != float(loss):
        raise bad("weight 0", "targets at weight-0 positions change the loss")
    for key, value in fn.metrics(out, garbage, w).items():
        if not _close(value, metrics[key]):
            raise bad("weight 0", f"targets at weight-0 positions change metric {key}")
    _metrics(subject, fn, kind, out, y, w, metrics, bad)
    grads = _run(subject, "gradients", where, nnx.grad(lambda h: h.loss(h(x1), y, w)), head)
    leaves = jax.tree.leaves(grads)
    if not leaves or not all(bool(jnp.isfinite(g).all()) for g in leaves):
        raise bad("gradients", "gradients of the loss are not finite")
    if not any(float(jnp.abs(g).max()) > 0 for g in leaves):
        raise bad("gradients", "gradients of the loss are all zero")


def _metrics(subject, fn, kind, out, y, w, metrics, bad):
    missing = METRICS[kind] - set(metrics)
    if missing:
        raise bad("metrics", f"keys {sorted(metrics)} lack {sorted(missing)}")
    if any(jnp.ndim(v) != 0 for v in metrics.values()):
        raise bad("shapes", "every metric must be a scalar")
    if kind == "regression" and "mse_rel" not in fn.metrics(out, y, w, baseline_mse=1.0):
        raise bad("metrics", "no mse_rel given baseline_mse")
    half = out.shape[0] // 2
    whole = fn.metric_sums(out, y, w)
    parts = [fn.metric_sums(out[sl], y[sl], w[sl]) for sl in (slice(None, half), slice(half, None))]
    for key in whole:
        if not _close(parts[0][key] + parts[1][key], whole[key], rtol=1e-5, atol=1e-5):
            raise bad("metrics", f"metric_sums[{key}] of two halves does not add up to the whole's")
    from_sums = fn.metrics_from_sums(whole)
    for key, value in metrics.items():
        if not _close(from_sums[key], value):
            raise bad(
                "metrics", f"metrics_from_sums gives {key}={float(from_sums[key]):.6g}, metrics {float(value):.6g}"
            )
