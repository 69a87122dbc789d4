"""check_normalizer: the whole `Normalizer` contract (attnlab.normalizers.base) run on one normalizer, one property
at a time, so that a broken normalizer is named by the property it breaks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab import statistics
from attnlab.checks import ConfigError
from attnlab.normalizers import reference as ref

from .settings import (
    BLOCK,
    FORWARD_SETTINGS,
    IMPL_RUNS,
    IMPL_SETTINGS,
    MASK_SETTINGS,
    B,
    H,
    N,
    qkv,
)
from .violation import ContractViolation, fail

ATOL, RTOL = 2e-5, 1e-4  # float32 against the float64 reference
FD_TOL = 1e-3  # |∇L·d − finite difference| ≤ FD_TOL · Σ|∇L ⊙ d|
PARAM_SHIFT = 0.3  # parameters (nnx.Param) are moved off their initial values by this × N(0, 1)
LARGE_LOGIT = 1e4  # |βz| the large-logit extreme reaches
LARGE_NORM = 1e3  # q and k scaled by this: inputs of large norm (reaches a normalizer invariant to the logit scale)
PARAM_REACH = 6.0  # a parameter without a declared range is checked at its value ± this (σ(±6): a saturated gate)
LAYER_INDEX = 3  # the layer a normalizer that `takes_layer_index` is told it is in: not 0, where a schedule starts

# The properties, in the order they are checked; each message starts `normalizer=<name>: <property>: `.
REFUSAL = "refusal"
SHAPES = "shapes"
DETERMINISM = "determinism"
FINITENESS = "finiteness"
NON_NEGATIVE = "weights must be non-negative"
PADDING = "padding keys must weigh 0"
MASKED = "masked keys must weigh 0"
PADDING_OUTPUT = "padding keys must not change the output"
PADDING_GRADIENT = "padding keys must get no gradient"
EMPTY_ROWS = "rows with no admissible key must be 0"
CAUSALITY = "causality"
STATISTICS = "statistics keys"
REFERENCE = "reference"
FINITE_DIFFERENCES = "gradients against finite differences"
IMPL = "impl={} equal to its dense form"
INPUT_GRADIENTS = "every input gets a gradient"
PARAMETER_GRADIENTS = "every parameter gets a gradient"
EXTREMES = "extremes"
SEEDS = "jit and vmapped seeds equal to each seed alone"
PROPERTIES = (
    REFUSAL,
    SHAPES,
    DETERMINISM,
    FINITENESS,
    NON_NEGATIVE,
    PADDING,
    MASKED,
    PADDING_OUTPUT,
    PADDING_GRADIENT,
    EMPTY_ROWS,
    CAUSALITY,
    STATISTICS,
    REFERENCE,
    FINITE_DIFFERENCES,
    IMPL,
    INPUT_GRADIENTS,
    PARAMETER_GRADIENTS,
    EXTREMES,
    SEEDS,
)


def _describe(got, want, atol, rtol) -> str | None:
    """Where got and want disagree beyond atol + rtol·|want| (equal infinities agree), or None."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    with np.errstate(invalid="ignore"):
        ok = (got == want) | (np.abs(got - want) <= atol + rtol * np.abs(want))
    if ok.all():
        return None
    idx = np.unravel_index(np.argmax(~ok), ok.shape)
    return (
        f"{got[idx]:.6g} where {want[idx]:.6g} is expected (index {tuple(int(i) for i in idx)}, {int((~ok).sum())} off)"
    )


def _first_difference(got, want) -> str | None:
    """Where two arrays are not the same bits (NaN equal to NaN), or None."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype} {got.shape} then {want.dtype} {want.shape}"
    same = (got == want) | (np.isnan(got) & np.isnan(want)) if got.dtype.kind in "fc" else got == want
    if same.all():
        return None
    idx = np.unravel_index(np.argmax(~same), same.shape)
    return f"{want[idx]:.9g} then {got[idx]:.9g} (index {tuple(int(i) for i in idx)}, {int((~same).sum())} differ)"


def _sizes(settings) -> str:
    """The sizes of several settings, for a property checked over all of them."""
    return f"B={B} N={N} H={H} " + ", ".join(f"mask={s.name} (T={s.T} S={s.S})" for s in settings)


class _Check:
    """One normalizer under check: builds it, and turns a failed comparison or a crash into a ContractViolation."""

    def __init__(self, make, name):
        self.make, self.subject = make, f"normalizer={name}"

    def fail(self, prop, what, where=""):
        return fail(self.subject, prop, what, where)

    def expect(self, prop, what_of, got, want, where, atol=ATOL, rtol=RTOL):
        problem = _describe(got, want, atol, rtol)
        if problem:
            raise self.fail(prop, f"{what_of} {problem}", where)

    def run(self, prop, where, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ContractViolation:
            raise
        except Exception as exc:  # noqa: BLE001 — any crash of the normalizer is a violation of `prop`
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise self.fail(prop, f"raised {type(exc).__name__}: {first}", where) from exc

    def build(self, seed=0, impl=None):
        """The normalizer from `make`, its parameters moved off their initial values (a fixed draw per seed)."""
        where = f"N={N} H={H} seed={seed}"
        norm = self.run("construction", where, self.make, num_heads=N, head_dim=H, rngs=nnx.Rngs(seed))
        if impl is not None:
            linear = bool(getattr(norm.capability(), "linear_chunk", 0))
            if linear and hasattr(norm, "chunk_size"):
                norm.chunk_size = BLOCK
            self.run("construction", f"{where} impl={impl}", norm.set_impl, impl, None if linear else BLOCK, H)
        if getattr(norm, "takes_layer_index", False):
            self.run("construction", f"{where} layer={LAYER_INDEX}", norm.set_layer_index, LAYER_INDEX)
        graphdef, params, rest = nnx.split(norm, nnx.Param, ...)
        leaves = jax.tree.leaves(params)
        keys = iter(jax.random.split(jax.random.key(100 + seed), max(len(leaves), 1)))
        params = jax.tree.map(lambda p: p + PARAM_SHIFT * jax.random.normal(next(keys), p.shape, p.dtype), params)
        return nnx.merge(graphdef, params, rest)


def check_normalizer(make, *, name: str, causal_only: bool | None = None) -> None:
    """Run the `Normalizer` contract on the normalizer `make(num_heads=, head_dim=, rngs=)` builds; raise
    ContractViolation naming the first broken property, the sizes and the mask setting.

    `make` is what attnlab builds from a YAML: functools.partial(cls, **options). Sizes B=2, N=3, H=5; the
    normalizer's parameters (nnx.Param) are moved off their initial values by a fixed random draw first, so a learned
    prior or per-head β is not checked at a trivial value, and a normalizer that `takes_layer_index` is told it is
    layer LAYER_INDEX. `causal_only` (default: the class attribute): the normalizer needs a causal mask; bidirectional
    settings are then checked to be refused and left out. The mask settings (attnlab.testing.MASK_SETTINGS): none,
    pad, causal_pad, causal_cross, dense (the forward settings; causal_pad and dense have rows with no admissible
    key) and grad (T=S=13, causal, padded). Each property is checked on its own, in this order (the message starts
    `normalizer=<name>: <property>: `), so that each is checked only where the ones before it hold:

    1. refusal: a causal-only normalizer refuses a bidirectional mask (call and weights), with an exception.
    2. shapes: `weights` (B,N,T,S); the output of the plain step and of the statistics step (B,N,T,H), float32 for
       float32 inputs and bfloat16 for bfloat16 ones.
    3. determinism: the same call twice (plain step, statistics step, weights) gives the same bits, eagerly and
       under jax.jit; a call leaves the normalizer's state (its nnx variables) as it was, and a call on other inputs
       in between changes nothing (no state kept between calls: numpy randomness, a counter, a cache).
    4. finiteness: outputs, weights and statistics at every forward setting, and the gradients of L = Σ c ⊙ out
       (plain step) in q, k, v and every parameter there and at grad, are finite (rows of no admissible key and
       masked keys included: the log of a masked zero is caught here, before any property compares gradients).
    5. weights must be non-negative (unless the class says `signed_weights`).
    6. padding keys must weigh 0 / masked keys must weigh 0, exactly, in rows that have an admissible key (a later
       key under a causal mask is named as causality: weight on it is a causal leak, at causal_pad); padding
       keys must not change the output (outputs and weights bit-identical when padded keys and values change);
       padding keys must get no gradient (at grad).
    7. rows with no admissible key must be 0: their weights and both outputs are exactly 0.
    8. causality (at grad): output row t gets no gradient from later keys or values nor from other queries.
    9. statistics keys: `with_stats=False` gives {}; with them, every CORE_STATS key and each statistic (N,); the
       keys are CORE_STATS plus the extras the reference reports, where there is a reference (a normalizer with
       `signed_weights` reports its own entropy there).
    10. reference, where the class defines `reference(q_BNTH, k_BNSH, admissible_BTS) -> (weights, logits,
        extras)` in float64 numpy: the weights, the output of both steps (weights @ v, or `reference_output(weights,
        v)` where the class defines it: reference.output), every CORE_STATS from its definition (reference.core_stats
        of the reference's weights and logits) unless the extras redefine it, and every extra equal to it; a declared
        statistic with no float64 definition is refused by name. The forward is held to its definition here, before
        any property that differentiates it, so that a wrong forward is named as such and not by the gradients,
        backends or extremes it also moves.
    11. gradients against finite differences (at grad): ∇L·d for random directions d of q, k and v equals the
        central difference, at either of two steps, of the float64 reference or else of the normalizer itself in
        float32 (a normalizer without a reference: of itself only); checked before the backends are compared, so
        that a wrong gradient of the dense form is named here and not as a backend that differs from it.
    12. impl=X equal to its dense form: each implementation the normalizer declares that runs on a CPU
        (`capability()`: blockwise, the fused XLA kernel, linear attention's chunked and bidirectional forms, at
        block/chunk size 4) equals its dense form (linear: the parallel form) forward and backward (q, k, v and every
        parameter) over IMPL_SETTINGS; a setting the implementation refuses with ConfigError is skipped, but each
        implementation runs at one at least. GPU-only implementations (cuDNN, Pallas) are not run here.
    13. every input gets a gradient (q and k, the values of every row that attends) and every parameter gets a
        gradient: each nnx.Param is nonzero somewhere over the settings of 4 (a stray stop_gradient fails here; 12
        leaves such a parameter out of its comparison).
    14. extremes: output, statistics, weights (non-negative) and gradients (q, k, v and parameters) stay finite at
        |βz| ≈ LARGE_LOGIT (float32 and bfloat16), at q and k scaled by LARGE_NORM (float32 and bfloat16: a
        normalizer invariant to the scale of the logits, such as cosine attention, meets no large logit
        otherwise), and with each parameter in turn at each end of its range: the class's `param_ranges`
        ({path: (lo, hi)}, path as "beta.theta") where it declares one (a temperature at its clamp), else its value
        ± PARAM_REACH (a saturated gate).
    15. jit and vmapped seeds: two builds (rngs seeds 0 and 1, their parameters moved apart) stacked and vmapped
        under jax.jit, as trainer.vmap_seeds does, give each seed's output, statistics, weights and gradients (q, k,
        v and parameters) of the eager call alone.
    """
    chk = _Check(make, name)
    norm = chk.build()
    if causal_only is None:
        causal_only = bool(getattr(norm, "causal_only", False))
    settings = [MASK_SETTINGS[s] for s in FORWARD_SETTINGS if MASK_SETTINGS[s].causal or not causal_only]
    if causal_only:
        _refuses_bidirectional(chk, norm)
    has_reference = callable(getattr(norm, "reference", None))
    signed = bool(getattr(norm, "signed_weights", False))
    runs = [_forward(chk, norm, s) for s in settings]
    _shapes(chk, norm, runs)
    _determinism(chk)
    grads = _finiteness(chk, norm, runs)
    for run in runs:
        _masks(chk, run, signed)
    _padding(chk, norm)
    for run in runs:
        _empty_rows(chk, run)
    _causality(chk, norm)
    references = (
        [_reference(chk, norm, r["q"], r["k"], r["s"].admissible(), r["s"].where()) for r in runs]
        if (has_reference)
        else [None] * len(runs)
    )
    for run, reference in zip(runs, references, strict=True):
        _statistics(chk, norm, run, reference)
    for run, reference in zip(runs, references, strict=True):
        if reference is not None:
            _against_reference(chk, norm, run, reference)
    _finite_differences(chk, norm, has_reference)
    never = _never_gradient(grads)
    _impls(chk, norm, causal_only, never)
    _inputs_and_parameters_get_gradients(chk, norm, grads, never, [r["s"] for r in runs])
    _extremes(chk, norm, signed)
    _jit_and_seeds(chk)


def _refuses_bidirectional(chk, norm):
    s = MASK_SETTINGS["pad"]
    q, k, v = qkv(7, s.T, s.S)
    for what, call in (("call", lambda: norm(q, k, v, s.mask())), ("weights", lambda: norm.weights(q, k, s.mask()))):
        try:
            call()
        except Exception:  # noqa: BLE001, S110 — a refusal is what is asked for
            continue
        raise chk.fail(REFUSAL, f"a causal-only normalizer took a bidirectional mask ({what})", s.where())


def _calls(norm, q, k, v, mask):
    """(plain output, statistics output, statistics, weights, the plain step's second value) of one normalizer."""
    out_p, none = norm(q, k, v, mask)
    out_s, stats = norm(q, k, v, mask, with_stats=True)
    return out_p, out_s, stats, norm.weights(q, k, mask), none


def _forward(chk, norm, s):
    """Every forward output of the normalizer at one setting."""
    q, k, v = qkv(7, s.T, s.S)
    mask, where = s.mask(), s.where()
    w = np.asarray(chk.run("weights", where, norm.weights, q, k, mask))
    out_s, stats = chk.run("statistics step", where, norm, q, k, v, mask, with_stats=True)
    out_p, none = chk.run("plain step", where, norm, q, k, v, mask)
    stats = {key: np.asarray(val) for key, val in stats.items()}
    return dict(s=s, q=q, k=k, v=v, w=w, out_s=out_s, out_p=out_p, stats=stats, none=none)


def _shapes(chk, norm, runs):
    for run in runs:
        s, where = run["s"], run["s"].where()
        if run["w"].shape != (B, N, s.T, s.S):
            raise chk.fail(SHAPES, f"weights have shape {run['w'].shape}, expected (B,N,T,S) {(B, N, s.T, s.S)}", where)
        for what, step in (("out_p", "plain step"), ("out_s", "statistics step")):
            out = run[what]
            if out.shape != (B, N, s.T, H) or out.dtype != jnp.float32:
                raise chk.fail(
                    SHAPES,
                    f"{step} output is {out.dtype} {out.shape}, expected float32 (B,N,T,H) {(B, N, s.T, H)}",
                    where,
                )
    s = MASK_SETTINGS["grad"]
    where = s.where(dtype="bfloat16")
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in qkv(8, s.T, s.S))
    out_p, out_s, _, w, _ = chk.run(SHAPES, where, _calls, norm, q, k, v, s.mask())
    for out, step in ((out_p, "plain step"), (out_s, "statistics step")):
        if out.shape != (B, N, s.T, H) or out.dtype != jnp.bfloat16:
            raise chk.fail(
                SHAPES,
                f"{step} output is {out.dtype} {out.shape} for bfloat16 inputs, expected bfloat16 (B,N,T,H)",
                where,
            )
    if w.shape != (B, N, s.T, s.S):
        raise chk.fail(SHAPES, f"weights have shape {w.shape} for bfloat16 inputs, expected (B,N,T,S)", where)


def _named_arrays(calls):
    """[(name, numpy array)] of _calls' outputs, the statistics by key."""
    out_p, out_s, stats, w, _ = calls
    named = [("plain step output", out_p), ("statistics step output", out_s), ("weights", w)]
    return [(what, np.asarray(x)) for what, x in named + [(f"statistic {k}", stats[k]) for k in sorted(stats)]]


def _state(norm):
    """[(path, numpy copy)] of every nnx variable of the normalizer."""
    return [(_dotted(p), np.array(x)) for p, x in jax.tree_util.tree_flatten_with_path(nnx.state(norm))[0]]


def _determinism(chk):
    """The same call twice, eagerly and under jax.jit, gives the same bits; no state is kept between calls."""
    s = MASK_SETTINGS["causal_pad"]
    mask, where = s.mask(), s.where()
    q, k, v = qkv(40, s.T, s.S)
    other = qkv(41, s.T, s.S)
    norm = chk.build()
    before = _state(norm)
    first = _named_arrays(chk.run(DETERMINISM, where, _calls, norm, q, k, v, mask))
    after = _state(norm)
    if [p for p, _ in before] != [p for p, _ in after]:
        raise chk.fail(DETERMINISM, "a call changed the normalizer's variables: state kept between calls", where)
    for (path, a), (_, b) in zip(before, after, strict=True):
        if _first_difference(b, a):
            raise chk.fail(
                DETERMINISM,
                f"a call changed the normalizer's {path} ({_first_difference(b, a)}): state kept between calls",
                where,
            )
    again = _named_arrays(chk.run(DETERMINISM, where, _calls, norm, q, k, v, mask))
    for (what, a), (_, b) in zip(first, again, strict=True):
        if _first_difference(b, a):
            raise chk.fail(
                DETERMINISM,
                f"the same call twice gives different bits (eagerly): {what} {_first_difference(b, a)}",
                where,
            )
    later = _named_arrays(chk.run(DETERMINISM, where, _calls, norm, *other, mask))
    fresh = _named_arrays(chk.run(DETERMINISM, where, _calls, chk.build(), *other, mask))
    for (what, a), (_, b) in zip(fresh, later, strict=True):
        if _first_difference(b, a):
            raise chk.fail(
                DETERMINISM,
                f"a call depends on the calls before it: the {what} of a fresh normalizer, then of one called before "
                f"on other inputs: {_first_difference(b, a)} (state kept between calls)",
                where,
            )
    graphdef, params, rest = nnx.split(norm, nnx.Param, ...)

    def jitted(params, rest, q, k, v):
        return _calls(nnx.merge(graphdef, params, rest), q, k, v, mask)[:4] + (None,)

    call = jax.jit(jitted)
    first = _named_arrays(chk.run(DETERMINISM, where, call, params, rest, q, k, v))
    again = _named_arrays(chk.run(DETERMINISM, where, call, params, rest, q, k, v))
    for (what, a), (_, b) in zip(first, again, strict=True):
        if _first_difference(b, a):
            raise chk.fail(
                DETERMINISM,
                f"the same call twice gives different bits under jax.jit: {what} {_first_difference(b, a)}",
                where,
            )


def _layer_input(norm, q, k):
    """{layer_input_BTD: a fixed random input} for a normalizer that `takes_layer_input` (its gates projected from
    it, so the projection has a gradient), else {}."""
    if not getattr(norm, "takes_layer_input", False):
        return {}
    B_, N_, _, H_ = q.shape
    x_BSD = np.random.default_rng(2).normal(size=(B_, k.shape[2], N_ * H_))
    return {"layer_input_BTD": jnp.asarray(x_BSD, q.dtype)}


def _plain_grads(norm, q, k, v, mask, c):
    """(out, (d params, dq, dk, dv)) of L = Σ c ⊙ out through the plain step, eagerly."""
    graphdef, params, rest = nnx.split(norm, nnx.Param, ...)
    kwargs = _layer_input(norm, q, k)

    def plain(params, q, k, v):
        return nnx.merge(graphdef, params, rest)(q, k, v, mask, **kwargs)[0]

    out, vjp = jax.vjp(plain, params, q, k, v)
    return out, vjp(jnp.asarray(c, out.dtype))


def _dotted(path) -> str:
    """A parameter's path in an nnx.State as attribute names, e.g. "beta.theta"."""
    parts = [str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))) for key in path]
    return ".".join(parts[:-1] if parts and parts[-1] == "value" else parts)


def _grad_names(grads):
    """[(name, array)] of (d params, dq, dk, dv): the parameters by path ("beta.theta")."""
    named = [(_dotted(p), g) for p, g in jax.tree_util.tree_flatten_with_path(grads[0])[0]]
    return named + [(f"d/d{x}", g) for x, g in zip("qkv", grads[1:], strict=True)]


def _finiteness(chk, norm, runs):
    """Finite outputs, weights, statistics and gradients at every forward setting and at grad; the gradients
    {setting name: (d params, dq, dk, dv)}."""
    for run in runs:
        where = run["s"].where()
        for what, x in _named_arrays((run["out_p"], run["out_s"], run["stats"], run["w"], None)):
            if not np.isfinite(x).all():
                raise chk.fail(FINITENESS, f"the {what} is not finite ({int((~np.isfinite(x)).sum())} entries)", where)
    grads = {}
    for s, seed in [(run["s"], 7) for run in runs] + [(MASK_SETTINGS["grad"], 21)]:
        q, k, v = qkv(seed, s.T, s.S)
        c = np.random.default_rng(20).normal(size=(B, N, s.T, H))
        _, grads[s.name] = chk.run(FINITENESS, s.where(), _plain_grads, norm, q, k, v, s.mask(), c)
        for what, g in _grad_names(grads[s.name]):
            g = np.asarray(g)
            if not np.isfinite(g).all():
                raise chk.fail(
                    FINITENESS,
                    f"gradients must be finite: {what} has {int((~np.isfinite(g)).sum())} non-finite entries",
                    s.where(),
                )
    return grads


def _masks(chk, run, signed):
    s, w = run["s"], run["w"]
    where, m = s.where(), s.admissible()
    if not signed and (w < 0).any():
        raise chk.fail(NON_NEGATIVE, f"weight {w.min():.3g}", where)
    has_keys = np.broadcast_to(m.any(-1)[:, None, :, None], w.shape)  # rows with no admissible key: _empty_rows
    off = ~np.broadcast_to(m[:, None], w.shape) & has_keys
    padded = np.broadcast_to(s.padded_BS()[:, None, None, :], w.shape)
    later = np.zeros(w.shape, bool)
    if s.causal:  # a key after the query's own position (the queries are the last T of the S keys)
        later = np.broadcast_to(np.arange(s.S)[None, :] > np.arange(s.T)[:, None] + (s.S - s.T), w.shape)
    leak = off & (w != 0)
    if (leak & padded).any():
        raise chk.fail(PADDING, f"weight {np.abs(w[leak & padded]).max():.3g} on a padded key", where)
    if (leak & later).any():
        weight = np.abs(w[leak & later]).max()
        raise chk.fail(CAUSALITY, f"weight {weight:.3g} on a later key, which the causal mask excludes", where)
    if leak.any():
        raise chk.fail(MASKED, f"weight {np.abs(w[leak]).max():.3g} on a key the mask excludes", where)


def _padding(chk, norm):
    """Padded keys and values change neither outputs nor weights, and get no gradient (at grad)."""
    s = MASK_SETTINGS["grad"]
    where, mask = s.where(), s.mask()
    q, k, v = qkv(21, s.T, s.S)
    rng = np.random.default_rng(22)
    k2, v2 = k.copy(), v.copy()
    pad = np.broadcast_to(s.padded_BS()[:, None, :, None], k.shape)
    k2[pad], v2[pad] = 10 * rng.normal(size=pad.sum()), 10 * rng.normal(size=pad.sum())
    one, two = (
        _named_arrays(chk.run(PADDING_OUTPUT, where, _calls, norm, q, kk, vv, mask)) for kk, vv in ((k, v), (k2, v2))
    )
    for (what, a), (_, b) in zip(one, two, strict=True):
        if what.startswith("statistic"):
            continue
        if _first_difference(b, a):
            raise chk.fail(PADDING_OUTPUT, f"changed padded keys/values change the {what}", where)
    c = np.random.default_rng(20).normal(size=(B, N, s.T, H))
    _, (_, _, gk, gv) = chk.run(PADDING_GRADIENT, where, _plain_grads, norm, q, k, v, mask, c)
    for g, what in ((gk, "keys"), (gv, "values")):
        if (pad & (np.asarray(g) != 0)).any():
            raise chk.fail(PADDING_GRADIENT, f"padded {what} get gradient", where)


def _empty_rows(chk, run):
    s, w = run["s"], run["w"]
    where, m = s.where(), s.admissible()
    empty_BNT = np.broadcast_to(~m.any(-1)[:, None], w.shape[:3])
    if not empty_BNT.any():
        return
    if (w[empty_BNT] != 0).any():
        raise chk.fail(EMPTY_ROWS, f"weight {np.abs(w[empty_BNT]).max():.3g} in such a row", where)
    for what, step in (("out_p", "plain step"), ("out_s", "statistics step")):
        out = np.asarray(run[what])
        if (out[empty_BNT] != 0).any():
            raise chk.fail(EMPTY_ROWS, f"{step} output {np.abs(out[empty_BNT]).max():.3g} on such a row", where)


def _causality(chk, norm):
    """No gradient from later keys or values, nor from other queries (at grad); whether a row that attends gets no
    gradient in its values is left to _inputs_and_parameters_get_gradients."""
    s = MASK_SETTINGS["grad"]
    where, mask = s.where(), s.mask()
    q, k, v = qkv(21, s.T, s.S)
    c = np.random.default_rng(20).normal(size=(B, N, s.T, H)).astype(np.float32)
    _, vjp = chk.run(CAUSALITY, where, jax.vjp, lambda q, k, v: norm(q, k, v, mask)[0], q, k, v)
    for t in (0, 3, 4, 9, s.T - 1):  # first row, block boundaries of size 4, mid-block, last (partial) block
        c_t = np.zeros_like(c)
        c_t[:, :, t] = c[:, :, t]
        gq, gk, gv = (np.asarray(g) for g in chk.run(CAUSALITY, where, vjp, jnp.asarray(c_t)))
        if (gk[:, :, t + 1 :] != 0).any() or (gv[:, :, t + 1 :] != 0).any():
            raise chk.fail(CAUSALITY, f"output row {t} gets gradient from later keys or values", where)
        if (np.delete(gq, t, axis=2) != 0).any():
            raise chk.fail(CAUSALITY, f"output row {t} gets gradient from other queries", where)


def _reference(chk, norm, q, k, m, where):
    w, logits, extras = chk.run(REFERENCE, where, norm.reference, *(np.asarray(x, np.float64) for x in (q, k)), m)
    return np.asarray(w, np.float64), np.asarray(logits, np.float64), {k: np.asarray(v) for k, v in extras.items()}


def _never_gradient(grads):
    """The paths of the parameters whose gradient is 0 at every setting (left to PARAMETER_GRADIENTS)."""
    named = [dict(_grad_names(g)) for g in grads.values()]
    paths = [p for p, _ in _grad_names(next(iter(grads.values())))[:-3]]
    return {p for p in paths if not any(np.any(np.asarray(n[p]) != 0) for n in named)}


def _finite_differences(chk, norm, has_reference):
    """∇L·d against the central difference (L(x + hd) − L(x − hd)) / 2h for each of q, k, v, at either of two steps h
    (a kink of relu or an entmax support boundary crossed by one step is seldom crossed by both), of the float64
    reference where there is one, else (or where that disagrees) of the normalizer in float32."""
    s = MASK_SETTINGS["grad"]
    mask, m, where = s.mask(), s.admissible(), s.where()
    q, k, v = qkv(21, s.T, s.S)
    c = np.random.default_rng(20).normal(size=(B, N, s.T, H)).astype(np.float32)
    _, vjp = chk.run(FINITE_DIFFERENCES, where, jax.vjp, lambda q, k, v: norm(q, k, v, mask)[0], q, k, v)
    grads = chk.run(FINITE_DIFFERENCES, where, vjp, jnp.asarray(c))
    c64 = c.astype(np.float64)

    def of_reference(q, k, v):
        w = _reference(chk, norm, q, k, m, where)[0]
        return float(np.sum(c64 * ref.output(norm, w, v)))

    def of_itself(q, k, v):
        out = norm(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)), mask)[0]
        return float(np.sum(c64 * np.asarray(out, np.float64)))

    sources = [("the float64 reference", of_reference, (1e-5, 1e-6))] if has_reference else []
    sources.append(("the normalizer in float32", of_itself, (1e-3, 1e-4)))
    rng = np.random.default_rng(25)
    x = [np.asarray(a, np.float64) for a in (q, k, v)]
    for i, what in enumerate("qkv"):
        d = rng.normal(size=x[i].shape)
        g = np.asarray(grads[i], np.float64)
        got, scale = float(np.sum(g * d)), float(np.sum(np.abs(g * d)))
        said = []
        for source, loss, steps in sources:
            fds = []
            for h in steps:
                plus, minus = list(x), list(x)
                plus[i], minus[i] = x[i] + h * d, x[i] - h * d
                fds.append(
                    chk.run(FINITE_DIFFERENCES, where, loss, *plus) - chk.run(FINITE_DIFFERENCES, where, loss, *minus)
                )
                fds[-1] /= 2 * h
                if abs(got - fds[-1]) <= FD_TOL * scale + 1e-6:
                    break
            else:
                said.append(f"{source} " + ", ".join(f"{fd:.6g} (h={h:g})" for fd, h in zip(fds, steps, strict=False)))
                continue
            break
        else:
            raise chk.fail(
                FINITE_DIFFERENCES,
                f"d/d{what} along a random direction is {got:.6g}, the central difference of " + "; of ".join(said),
                where,
            )


def _inputs_and_parameters_get_gradients(chk, norm, grads, never, settings):
    s = MASK_SETTINGS["grad"]
    where, mask = s.where(), s.mask()
    q, k, v = qkv(21, s.T, s.S)
    _, gq, gk, gv = (np.asarray(g) if i else g for i, g in enumerate(grads["grad"]))
    for g, what in ((gq, "q"), (gk, "k")):
        if not np.abs(g).sum() > 0:
            raise chk.fail(INPUT_GRADIENTS, f"d/d{what} is all zero", where)
    attends = np.asarray(norm.weights(q, k, mask)) != 0
    c = np.random.default_rng(20).normal(size=(B, N, s.T, H)).astype(np.float32)
    _, vjp = jax.vjp(lambda v: norm(q, k, v, mask)[0], v)
    for t in (0, 3, 4, 9, s.T - 1):
        if not attends[:, :, t].any():
            continue
        c_t = np.zeros_like(c)
        c_t[:, :, t] = c[:, :, t]
        (gv_t,) = vjp(jnp.asarray(c_t))
        if not np.abs(np.asarray(gv_t)).sum() > 0:
            raise chk.fail(INPUT_GRADIENTS, f"output row {t} attends but its values get no gradient", where)
    for path in sorted(never):
        raise chk.fail(
            PARAMETER_GRADIENTS,
            f"parameter {path} gets no gradient at any setting (a stop_gradient, or a parameter the output does not "
            "use)",
            _sizes(settings + [s]),
        )


def _cpu_impls(norm) -> tuple[list[str], str]:
    """The implementations a CPU runs besides the dense form, and the name of the dense form."""
    capability = norm.capability() if hasattr(norm, "capability") else None
    if capability is None:
        return [], "dense"
    if getattr(capability, "linear_chunk", 0):
        return ["chunked", "auto"], "parallel"  # auto: the bidirectional form without a causal mask
    impls = ["blockwise"] if getattr(capability, "blockwise", False) else []
    return impls + (["xla"] if getattr(capability, "fused", False) else []), "dense"


def _out_and_grads(norm, q, k, v, mask, ct):
    """(out, (d params, dq, dk, dv)) of Σ ct ⊙ out, jitted over the parameters and inputs; a normalizer that
    `takes_layer_input` (its gates projected from it) gets a fixed random one, so its projection has a gradient."""
    graphdef, params, rest = nnx.split(norm, nnx.Param, ...)
    kwargs = _layer_input(norm, q, k)

    def loss(params, q, k, v):
        out, _ = nnx.merge(graphdef, params, rest)(q, k, v, mask, **kwargs)
        return jnp.sum(out * ct), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True))(params, q, k, v)
    return out, grads


def _impls(chk, norm, causal_only, never=frozenset()):
    impls, dense = _cpu_impls(norm)
    slow, dense_runs = chk.build(impl=dense) if impls else None, {}
    for impl in impls:
        fast = chk.build(impl=impl)
        prop = IMPL.format(impl)
        names = [n for n in IMPL_RUNS.get(impl, tuple(IMPL_SETTINGS)) if IMPL_SETTINGS[n].causal or not causal_only]
        ran = 0
        for s in (IMPL_SETTINGS[n] for n in names):
            q, k, v = (jnp.asarray(x) for x in qkv(0, s.T, s.S))
            ct = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
            where = s.where(block=BLOCK)
            try:
                out_f, g_f = _out_and_grads(fast, q, k, v, s.mask(), ct)
            except ConfigError:
                continue  # this implementation cannot express the setting (its refusal is tested in test_impl)
            except Exception as exc:  # noqa: BLE001
                raise chk.fail(prop, f"raised {type(exc).__name__}: {str(exc).splitlines()[0]}", where) from exc
            ran += 1
            if s.name not in dense_runs:
                dense_runs[s.name] = chk.run(prop, where, _out_and_grads, slow, q, k, v, s.mask(), ct)
            out_d, g_d = dense_runs[s.name]
            chk.expect(prop, "forward:", out_f, out_d, where, atol=2e-6, rtol=2e-5)
            for (what, a), (_, b) in zip(_grad_names(g_f), _grad_names(g_d), strict=True):
                if what not in never:  # a parameter the dense form never differentiates: PARAMETER_GRADIENTS
                    chk.expect(prop, f"backward {what}:", a, b, where, atol=1e-5, rtol=1e-4)
        if not ran:
            raise chk.fail(prop, "it ran at none of the settings " + ", ".join(names), f"B={B} N={N} H={H}")


def _param_ends(norm, params):
    """[(description, params)] with each parameter in turn at each end of its range: the class's `param_ranges`
    ({"beta.theta": (lo, hi)}) where declared, else its value ± PARAM_REACH."""
    declared = dict(getattr(norm, "param_ranges", None) or {})
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    out = []
    for i, (path, value) in enumerate(flat):
        dotted = _dotted(path)
        if dotted in declared:
            lo, hi = declared[dotted]
            ends = [(f"with parameter {dotted} at its declared low end {lo:g}", jnp.full_like(value, lo))]
            ends.append((f"with parameter {dotted} at its declared high end {hi:g}", jnp.full_like(value, hi)))
        else:
            ends = [
                (f"with parameter {dotted} at its value {sign:+g}", value + sign)
                for sign in (-PARAM_REACH, PARAM_REACH)
            ]
        for what, end in ends:
            leaves = [end if j == i else x for j, (_, x) in enumerate(flat)]
            out.append((what, jax.tree_util.tree_unflatten(treedef, leaves)))
    return out


def _inverse_temperature(norm) -> np.ndarray:
    """β (N,) where the normalizer has a `beta()` (InverseTemperature), else 1: the scale its logits take of z."""
    beta = getattr(norm, "beta", None)
    try:
        return np.broadcast_to(np.abs(np.asarray(beta(), np.float64)), (N,)) if callable(beta) else np.ones(N)
    except Exception:  # noqa: BLE001 — a `beta` of another meaning: the logits are taken as z
        return np.ones(N)


def _extremes(chk, norm, signed):
    """Finite output, statistics, weights and gradients at large logits, at inputs of large norm and with each
    parameter at the ends of its range."""
    s = MASK_SETTINGS["grad"]
    mask, m = s.mask(), s.admissible()
    q, k, v = qkv(24, s.T, s.S)
    graphdef, params, rest = nnx.split(norm, nnx.Param, ...)
    ct = jnp.cos(jnp.arange(B * N * s.T * H, dtype=jnp.float32)).reshape(B, N, s.T, H)
    kwargs = _layer_input(norm, jnp.asarray(q), jnp.asarray(k))

    def everything(params, q, k, v):
        def loss(params, q, k, v):
            mod = nnx.merge(graphdef, params, rest)
            out, stats = mod(q, k, v, mask, with_stats=True, **kwargs)
            return jnp.sum(out.astype(jnp.float32) * ct), (out, stats, mod.weights(q, k, mask, **kwargs))

        grads, aux = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(params, q, k, v)
        return aux, grads

    call = jax.jit(everything)
    beta_N = _inverse_temperature(norm)
    z = beta_N[None, :, None, None] * ref.scores(q, k)
    q_large = q * np.float32(LARGE_LOGIT / max(np.abs(np.where(m[:, None], z, 0)).max(), 1e-30))
    trials = []
    for dtype in (jnp.float32, jnp.bfloat16):
        name = jnp.dtype(dtype).name
        trials.append((f"at logits |βz| up to {LARGE_LOGIT:g} ({name})", params, (q_large, k, v), dtype))
        trials.append(
            (f"at q and k of large norm (× {LARGE_NORM:g}, {name})", params, (q * LARGE_NORM, k * LARGE_NORM, v), dtype)
        )
    trials += [(what, ends, (q, k, v), jnp.float32) for what, ends in _param_ends(norm, params)]
    for what, p, inputs, dtype in trials:
        where = s.where()
        (out, stats, w), grads = chk.run(
            EXTREMES, f"{where} ({what})", call, p, *(jnp.asarray(x, dtype) for x in inputs)
        )
        arrays = [("the output", out), ("the weights", w)] + [(f"statistic {key}", val) for key, val in stats.items()]
        arrays += [(f"the gradient {g}", a) for g, a in _grad_names(grads)]
        for name_, x in arrays:
            if not np.isfinite(np.asarray(x, np.float32)).all():
                raise chk.fail(EXTREMES, f"{name_} must stay finite {what}", where)
        if not signed and (np.asarray(w, np.float32) < 0).any():
            raise chk.fail(EXTREMES, f"the weights must stay non-negative {what}", where)


def _jit_and_seeds(chk):
    s = MASK_SETTINGS["grad"]
    mask = s.mask()
    norms = [chk.build(seed) for seed in (0, 1)]
    graphdef = nnx.graphdef(norms[0])
    splits = [nnx.split(n, nnx.Param, ...)[1:] for n in norms]
    ct = jnp.asarray(np.random.default_rng(26).normal(size=(B, N, s.T, H)), jnp.float32)

    def everything(params, rest, q, k, v):
        def loss(params, q, k, v):
            mod = nnx.merge(graphdef, params, rest)
            out, stats = mod(q, k, v, mask, with_stats=True)
            return jnp.sum(out * ct), (out, stats, mod.weights(q, k, mask))

        (_, aux), grads = jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True)(params, q, k, v)
        return aux, grads

    inputs = [tuple(jnp.asarray(x) for x in qkv(30 + seed, s.T, s.S)) for seed in (0, 1)]
    alone = [chk.run(SEEDS, s.where(seed=i), everything, *splits[i], *inputs[i]) for i in (0, 1)]
    stack = jax.tree.map(lambda *xs: jnp.stack(xs), (*splits[0], *inputs[0]), (*splits[1], *inputs[1]))
    vmapped = chk.run(SEEDS, s.where(seeds=2), jax.jit(jax.vmap(everything)), *stack)
    for i in (0, 1):
        one = jax.tree.map(lambda x, i=i: x[i], vmapped)
        _same_tree(chk, SEEDS, one, alone[i], s.where(seed=i), atol=1e-5, rtol=1e-5)


def _same_tree(chk, prop, got, want, where, atol, rtol):
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    want_leaves = jax.tree_util.tree_leaves(want)
    if len(got_leaves) != len(want_leaves):
        raise chk.fail(prop, f"{len(got_leaves)} arrays where {len(want_leaves)} are expected", where)
    for (path, a), b in zip(got_leaves, want_leaves, strict=True):
        scale = max(1.0, float(np.abs(np.asarray(b, np.float64)).max(initial=0)))  # gradients sum many rounded terms
        chk.expect(prop, f"{_path_name(path)}:", a, b, where, atol=atol * scale, rtol=rtol)


def _path_name(path) -> str:
    """(aux|grads)[i]… as out/stats/weights and d/dparams, d/dq, d/dk, d/dv."""
    first = path[0].idx if hasattr(path[0], "idx") else 0
    second = path[1].idx if len(path) > 1 and hasattr(path[1], "idx") else 0
    if first == 0:
        return ("output", "statistic", "weights")[second] + jax.tree_util.keystr(path[2:])
    return ("d/dparams", "d/dq", "d/dk", "d/dv")[second] + jax.tree_util.keystr(path[2:])


def _statistics(chk, norm, run, reference):
    where = run["s"].where()
    if run["none"]:
        raise chk.fail(STATISTICS, f"with_stats=False returned {sorted(run['none'])}, expected {{}}", where)
    missing = set(statistics.CORE_STATS) - set(run["stats"])
    if missing:
        raise chk.fail(STATISTICS, f"CORE_STATS {sorted(missing)} missing from {sorted(run['stats'])}", where)
    for key, val in run["stats"].items():
        if val.shape != (N,):
            raise chk.fail(STATISTICS, f"statistic {key} has shape {val.shape}, expected (N,) ({N},)", where)
    if reference is None:
        return
    extras = reference[2]
    if getattr(norm, "signed_weights", False) and "entropy" not in extras:
        raise chk.fail(
            STATISTICS,
            "a normalizer with signed weights defines its own entropy (its reference's extras): the entropy of "
            "signed weights is undefined",
            where,
        )
    declared = set(statistics.CORE_STATS) | set(extras)
    if set(run["stats"]) != declared:
        raise chk.fail(
            STATISTICS,
            f"got {sorted(run['stats'])}, expected CORE_STATS + the reference's extras {sorted(declared)}",
            where,
        )


def _against_reference(chk, norm, run, reference):
    where, m = run["s"].where(), run["s"].admissible()
    w_ref, logits_ref, extras = reference
    chk.expect(REFERENCE, "weights:", run["w"], w_ref, where)
    out_ref = ref.output(norm, w_ref, run["v"])
    chk.expect(REFERENCE, "output (plain step):", run["out_p"], out_ref, where)
    chk.expect(REFERENCE, "output (statistics step):", run["out_s"], out_ref, where)
    try:
        want = reference_statistics(w_ref, logits_ref, m, extras)
    except KeyError as missing:
        raise chk.fail(REFERENCE, missing.args[0], where) from None
    for key, value in want.items():
        chk.expect(REFERENCE, f"statistic {key}:", run["stats"][key], value, where)


def reference_statistics(w_BNTS, logits_BNTS, m_BTS, extras, q_pos_T=None) -> dict[str, np.ndarray]:
    """The float64 value of every declared statistic a normalizer reports: each of CORE_STATS (as declared in
    attnlab.statistics when called) from its definition in reference.core_stats unless the reference's extras
    redefine it, then the extras. KeyError, naming it, for a declared statistic with no float64 definition: the
    comparison iterates the declared statistics, so a new one cannot pass unchecked."""
    defined = {**ref.core_stats(w_BNTS, logits_BNTS, m_BTS, q_pos_T), **extras}
    undefined = [name for name in statistics.CORE_STATS if name not in defined]
    if undefined:
        raise KeyError(
            f"statistic attn_{undefined[0]} has no reference definition (a float64 one in "
            "attnlab.normalizers.reference.core_stats, or the normalizer's reference extras)"
        )
    return {name: defined[name] for name in (*statistics.CORE_STATS, *extras)}
