"""check_normalizer: the whole `Normalizer` contract (attnlab.normalizers.base) run on one normalizer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.checks import ConfigError
from attnlab.normalizers import reference as ref
from attnlab.normalizers.base import CORE_STATS

from .settings import (
    BLOCK,
    EMPTY_ROW_SETTINGS,
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
LARGE_LOGIT = 1e4
LAYER_INDEX = 3  # the layer a normalizer that `takes_layer_index` is told it is in: not 0, where a schedule starts


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
    layer LAYER_INDEX. `causal_only` (default: the class attribute): the
    normalizer needs a causal mask; bidirectional settings are then checked to be refused and left out. Properties,
    in the order they are checked (`name` in the message):

    - refusal: a causal-only normalizer refuses a bidirectional mask (call and weights), with an exception.
    - shapes: `weights` (B,N,T,S); the output (B,N,T,H) in the inputs' dtype, with and without statistics.
    - statistics keys: `with_stats=False` gives {}; with them, each statistic is finite and (N,), the keys are
      CORE_STATS plus the extras the reference reports (CORE_STATS at least without a reference).
    - masks and padding, over the settings none, pad, causal_pad, causal_cross, dense (MASK_SETTINGS): weights are
      finite and ≥ 0 (any sign where the class says `signed_weights`); padding keys weigh 0 and so do keys outside
      the causal/explicit mask (exactly); rows with no admissible key have output 0.
    - reference, where the class defines `reference(q_BNTH, k_BNSH, admissible_BTS) -> (weights, logits, extras)` in
      float64 numpy: weights, the output (plain step and statistics step) weights @ v or, where the class defines
      `reference_output(weights, v)`, that (reference.output), every CORE_STATS from its definition
      (reference.core_stats of the reference's weights and logits) unless the extras redefine it (the entropy,
      which a normalizer with `signed_weights` must), and every extra equal to it.
    - gradients, at T=S=13 causal with padding (setting grad): output row t gets no gradient from later keys or
      values nor from other queries; padding keys and values get none; changing padded keys and values leaves
      outputs and weights bit-identical; gradients are finite (also with rows of no admissible key, and at logits
      |βz| ≈ 1e4 in float32 and bfloat16, where the output, statistics and weights stay finite too); ∇L·d for
      L = Σ c ⊙ out and random directions d of q, k and v equals the central finite difference of the float64
      reference (of the normalizer itself in float32 without one), at either of two steps.
    - impl: each implementation the normalizer declares that runs on a CPU (`capability()`: blockwise, the fused
      XLA kernel, linear attention's chunked and bidirectional forms, at block/chunk size 4) equals its dense form
      (linear: the parallel form) forward and backward (q, k, v and every parameter, each of which gets a
      gradient) over IMPL_SETTINGS; a setting the implementation refuses with ConfigError is skipped, but each
      implementation runs at one at least. GPU-only implementations (cuDNN, Pallas) are not run here.
    - jit and vmapped seeds: two builds (rngs seeds 0 and 1, their parameters moved apart) stacked and vmapped under
      jax.jit, as trainer.vmap_seeds does, give each seed's output, statistics, weights and gradients (q, k, v and
      parameters) of the eager call alone.
    """
    chk = _Check(make, name)
    norm = chk.build()
    if causal_only is None:
        causal_only = bool(getattr(norm, "causal_only", False))
    settings = [MASK_SETTINGS[s] for s in FORWARD_SETTINGS if MASK_SETTINGS[s].causal or not causal_only]
    if causal_only:
        _refuses_bidirectional(chk, norm)
    has_reference = callable(getattr(norm, "reference", None))
    runs = [_forward(chk, norm, s) for s in settings]
    for run in runs:
        _structure(chk, run)
    signed = bool(getattr(norm, "signed_weights", False))
    for run in runs:
        _masks(chk, run, signed)
    if has_reference:
        for run in runs:
            _against_reference(chk, norm, run)
    _gradients(chk, norm, has_reference, [s for s in settings if s.name in EMPTY_ROW_SETTINGS])
    _impls(chk, norm, causal_only)
    _jit_and_seeds(chk)


def _refuses_bidirectional(chk, norm):
    s = MASK_SETTINGS["pad"]
    q, k, v = qkv(7, s.T, s.S)
    for what, call in (("call", lambda: norm(q, k, v, s.mask())), ("weights", lambda: norm.weights(q, k, s.mask()))):
        try:
            call()
        except Exception:  # noqa: BLE001, S110 — a refusal is what is asked for
            continue
        raise chk.fail("refusal", f"a causal-only normalizer took a bidirectional mask ({what})", s.where())


def _forward(chk, norm, s):
    """Every forward output of the normalizer at one setting."""
    q, k, v = qkv(7, s.T, s.S)
    mask, where = s.mask(), s.where()
    w = np.asarray(chk.run("weights", where, norm.weights, q, k, mask))
    out_s, stats = chk.run("statistics step", where, norm, q, k, v, mask, with_stats=True)
    out_p, none = chk.run("plain step", where, norm, q, k, v, mask)
    stats = {key: np.asarray(val) for key, val in stats.items()}
    return dict(s=s, q=q, k=k, v=v, w=w, out_s=out_s, out_p=out_p, stats=stats, none=none)


def _structure(chk, run):
    s, where = run["s"], run["s"].where()
    if run["w"].shape != (B, N, s.T, s.S):
        raise chk.fail("shapes", f"weights have shape {run['w'].shape}, expected (B,N,T,S) {(B, N, s.T, s.S)}", where)
    for what in ("out_p", "out_s"):
        out = run[what]
        step = "plain step" if what == "out_p" else "statistics step"
        if out.shape != (B, N, s.T, H) or out.dtype != jnp.float32:
            raise chk.fail(
                "shapes",
                f"{step} output is {out.dtype} {out.shape}, expected float32 (B,N,T,H) {(B, N, s.T, H)}",
                where,
            )
    if run["none"]:
        raise chk.fail("statistics keys", f"with_stats=False returned {sorted(run['none'])}, expected {{}}", where)
    missing = set(CORE_STATS) - set(run["stats"])
    if missing:
        raise chk.fail("statistics keys", f"CORE_STATS {sorted(missing)} missing from {sorted(run['stats'])}", where)
    for key, val in run["stats"].items():
        if val.shape != (N,):
            raise chk.fail("statistics keys", f"statistic {key} has shape {val.shape}, expected (N,) ({N},)", where)
        if not np.isfinite(val).all():
            raise chk.fail("statistics keys", f"statistic {key} is not finite: {val}", where)


def _masks(chk, run, signed):
    s, w = run["s"], run["w"]
    where, m = s.where(), s.admissible()
    if not np.isfinite(w).all():
        raise chk.fail("masks", "weights must be finite: found non-finite weights", where)
    for what in ("out_p", "out_s"):
        if not np.isfinite(np.asarray(run[what])).all():
            raise chk.fail("masks", "outputs must be finite: found non-finite outputs", where)
    if not signed and (w < 0).any():
        raise chk.fail("masks", f"weights must be non-negative: weight {w.min():.3g}", where)
    off = ~np.broadcast_to(m[:, None], w.shape)
    padded = np.broadcast_to(s.padded_BS()[:, None, None, :], w.shape)
    leak = off & (w != 0)
    if (leak & padded).any():
        weight = np.abs(w[leak & padded]).max()
        raise chk.fail("padding keys must weigh 0", f"weight {weight:.3g} on a padded key", where)
    if leak.any():
        raise chk.fail(
            "masked keys must weigh 0", f"weight {np.abs(w[leak]).max():.3g} on a key the mask excludes", where
        )
    empty_BNT = np.broadcast_to(~m.any(-1)[:, None], w.shape[:3])
    for what in ("out_p", "out_s"):
        out = np.asarray(run[what])
        if empty_BNT.any() and (out[empty_BNT] != 0).any():
            value = np.abs(out[empty_BNT]).max()
            raise chk.fail("rows with no admissible key must be 0", f"output {value:.3g} on such a row", where)


def _reference(chk, norm, q, k, m, where):
    w, logits, extras = chk.run("reference", where, norm.reference, *(np.asarray(x, np.float64) for x in (q, k)), m)
    return np.asarray(w, np.float64), np.asarray(logits, np.float64), {k: np.asarray(v) for k, v in extras.items()}


def _against_reference(chk, norm, run):
    where, m = run["s"].where(), run["s"].admissible()
    w_ref, logits_ref, extras = _reference(chk, norm, run["q"], run["k"], m, where)
    declared = set(CORE_STATS) | set(extras)
    if getattr(norm, "signed_weights", False) and "entropy" not in extras:
        raise chk.fail(
            "statistics keys",
            "a normalizer with signed weights defines its own entropy (its reference's extras): the entropy of "
            "signed weights is undefined",
            where,
        )
    if set(run["stats"]) != declared:
        raise chk.fail(
            "statistics keys",
            f"got {sorted(run['stats'])}, expected CORE_STATS + the reference's extras {sorted(declared)}",
            where,
        )
    chk.expect("reference", "weights:", run["w"], w_ref, where)
    out_ref = ref.output(norm, w_ref, run["v"])
    chk.expect("reference", "output (plain step):", run["out_p"], out_ref, where)
    chk.expect("reference", "output (statistics step):", run["out_s"], out_ref, where)
    for key, want in {**ref.core_stats(w_ref, logits_ref, m), **extras}.items():
        chk.expect("reference", f"statistic {key}:", run["stats"][key], want, where)


def _loss_and_grads(norm, q, k, v, mask, c):
    """(out, (dq, dk, dv)) of L = Σ c ⊙ out through the plain step."""
    out, vjp = jax.vjp(lambda q, k, v: norm(q, k, v, mask)[0], q, k, v)
    return out, vjp(jnp.asarray(c, out.dtype))


def _gradients(chk, norm, has_reference, empty_row_settings):
    s = MASK_SETTINGS["grad"]
    q, k, v = qkv(21, s.T, s.S)
    c = np.random.default_rng(20).normal(size=(B, N, s.T, H)).astype(np.float32)
    grads = _causality_and_padding(chk, norm, s, q, k, v, c)
    _finite_differences(chk, norm, has_reference, s, q, k, v, c, grads)
    for e in empty_row_settings:
        qe, ke, ve = qkv(23, e.T, e.S)
        grads = chk.run("gradient", e.where(), _loss_and_grads, norm, qe, ke, ve, e.mask(), np.ones((B, N, e.T, H)))[1]
        if not all(np.isfinite(np.asarray(g)).all() for g in grads):
            raise chk.fail("gradient", "gradients must be finite with rows of no admissible key", e.where())
    for dtype in (jnp.float32, jnp.bfloat16):
        _large_logits(chk, norm, s, dtype, bool(getattr(norm, "signed_weights", False)))


def _causality_and_padding(chk, norm, s, q, k, v, c):
    """Exact zeros of the gradients where causality and padding say, and (dq, dk, dv) of Σ c ⊙ out."""
    where, mask = s.where(), s.mask()
    _, vjp = chk.run("gradient", where, jax.vjp, lambda q, k, v: norm(q, k, v, mask)[0], q, k, v)
    attends = np.asarray(norm.weights(q, k, mask)) != 0
    for t in (0, 3, 4, 9, s.T - 1):  # first row, block boundaries of size 4, mid-block, last (partial) block
        c_t = np.zeros_like(c)
        c_t[:, :, t] = c[:, :, t]
        gq, gk, gv = (np.asarray(g) for g in chk.run("gradient", where, vjp, jnp.asarray(c_t)))
        if (gk[:, :, t + 1 :] != 0).any() or (gv[:, :, t + 1 :] != 0).any():
            raise chk.fail("causality", f"output row {t} gets gradient from later keys or values", where)
        if (np.delete(gq, t, axis=2) != 0).any():
            raise chk.fail("causality", f"output row {t} gets gradient from other queries", where)
        if attends[:, :, t].any() and not np.abs(gv[:, :, : t + 1]).sum() > 0:
            raise chk.fail("gradient", f"output row {t} attends but its values get no gradient", where)
    gq, gk, gv = (np.asarray(g) for g in vjp(jnp.asarray(c)))
    if not all(np.isfinite(g).all() for g in (gq, gk, gv)):
        raise chk.fail("gradient", "gradients must be finite", where)
    padded = s.padded_BS()[:, None, :, None]
    for g, what in ((gk, "keys"), (gv, "values")):
        if (np.broadcast_to(padded, g.shape) & (g != 0)).any():
            raise chk.fail("padding keys must get no gradient", f"padded {what} get gradient", where)
    for g, what in ((gq, "q"), (gk, "k")):
        if not np.abs(g).sum() > 0:
            raise chk.fail("gradient", f"d/d{what} is all zero", where)
    rng = np.random.default_rng(22)
    k2, v2 = k.copy(), v.copy()
    pad = np.broadcast_to(padded, k.shape)
    k2[pad], v2[pad] = 10 * rng.normal(size=pad.sum()), 10 * rng.normal(size=pad.sum())
    if not np.array_equal(
        np.asarray(norm(q, k2, v2, mask)[0]), np.asarray(norm(q, k, v, mask)[0])
    ) or not np.array_equal(np.asarray(norm.weights(q, k2, mask)), np.asarray(norm.weights(q, k, mask))):
        raise chk.fail("padding keys must not change the output", "changed padded keys/values change it", where)
    return gq, gk, gv


def _finite_differences(chk, norm, has_reference, s, q, k, v, c, grads):
    """∇L·d against the central difference (L(x + hd) − L(x − hd)) / 2h for each of q, k, v, at either of two steps h
    (a kink of relu or an entmax support boundary crossed by one step is seldom crossed by both)."""
    mask, m = s.mask(), s.admissible()
    rng = np.random.default_rng(25)
    c64 = c.astype(np.float64)
    if has_reference:
        steps, source = (1e-5, 1e-6), "the float64 reference"

        def loss(q, k, v):
            w = _reference(chk, norm, q, k, m, s.where())[0]
            return float(np.sum(c64 * ref.output(norm, w, v)))
    else:
        steps, source = (1e-3, 1e-4), "the normalizer in float32"

        def loss(q, k, v):
            return float(np.sum(c64 * np.asarray(norm(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)), mask)[0])))

    x = [np.asarray(a, np.float64) for a in (q, k, v)]
    for i, what in enumerate("qkv"):
        d = rng.normal(size=x[i].shape)
        g = np.asarray(grads[i], np.float64)
        got, scale = float(np.sum(g * d)), float(np.sum(np.abs(g * d)))
        fds = []
        for h in steps:
            plus, minus = list(x), list(x)
            plus[i], minus[i] = x[i] + h * d, x[i] - h * d
            fds.append((loss(*plus) - loss(*minus)) / (2 * h))
            if abs(got - fds[-1]) <= FD_TOL * scale + 1e-6:
                break
        else:
            differences = ", ".join(f"{fd:.6g} (h={h:g})" for fd, h in zip(fds, steps, strict=True))
            raise chk.fail(
                "gradient",
                f"d/d{what} along a random direction is {got:.6g}, the central difference of {source} {differences}",
                s.where(),
            )


def _large_logits(chk, norm, s, dtype, signed):
    """Finite output, statistics, weights and gradients once |βz| reaches LARGE_LOGIT."""
    mask, m = s.mask(), s.admissible()
    q, k, v = qkv(24, s.T, s.S)
    beta = getattr(norm, "beta", None)
    beta_N = np.asarray(beta(), np.float64) if callable(beta) else np.ones(N)
    z = beta_N[None, :, None, None] * ref.scores(q, k)
    q = q * np.float32(LARGE_LOGIT / np.abs(np.where(m[:, None], z, 0)).max())
    q, k, v = (jnp.asarray(x, dtype) for x in (q, k, v))
    where = s.where(dtype=jnp.dtype(dtype).name, logits=f"±{LARGE_LOGIT:g}")
    ct = jnp.cos(jnp.arange(B * N * s.T * H, dtype=jnp.float32)).reshape(B, N, s.T, H)

    def loss(q, k, v):
        out, stats = norm(q, k, v, mask, with_stats=True)
        return jnp.sum(out.astype(jnp.float32) * ct), (out, stats)

    grads, (out, stats) = chk.run("gradient", where, jax.grad(loss, argnums=(0, 1, 2), has_aux=True), q, k, v)
    if out.dtype != dtype:
        raise chk.fail("shapes", f"output is {out.dtype} for {jnp.dtype(dtype).name} inputs", where)
    if not np.isfinite(np.asarray(out, np.float32)).all():
        raise chk.fail("gradient", "the output must stay finite at large logits", where)
    if not all(np.isfinite(np.asarray(val)).all() for val in stats.values()):
        raise chk.fail("gradient", "statistics must stay finite at large logits", where)
    if not all(np.isfinite(np.asarray(g, np.float32)).all() for g in grads):
        raise chk.fail("gradient", "gradients must be finite at large logits", where)
    w = np.asarray(chk.run("weights", where, norm.weights, q, k, mask), np.float32)
    if not (np.isfinite(w).all() and (signed or (w >= 0).all())):
        raise chk.fail("masks", "weights must stay finite and non-negative at large logits", where)


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
    kwargs = {}
    if getattr(norm, "takes_layer_input", False):
        B_, N_, _, H_ = q.shape
        x_BSD = np.random.default_rng(2).normal(size=(B_, k.shape[2], N_ * H_))
        kwargs["layer_input_BTD"] = jnp.asarray(x_BSD, jnp.float32)

    def loss(params, q, k, v):
        out, _ = nnx.merge(graphdef, params, rest)(q, k, v, mask, **kwargs)
        return jnp.sum(out * ct), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True))(params, q, k, v)
    return out, grads


def _impls(chk, norm, causal_only):
    impls, dense = _cpu_impls(norm)
    slow, dense_runs = chk.build(impl=dense) if impls else None, {}
    for impl in impls:
        fast = chk.build(impl=impl)
        prop = f"impl={impl} equal to its dense form"
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
            params_f, params_d = (jax.tree_util.tree_flatten_with_path(g[0])[0] for g in (g_f, g_d))
            named = [(jax.tree_util.keystr(p), a, b) for (p, a), (_, b) in zip(params_f, params_d, strict=True)]
            named += [(f"d/d{x}", a, b) for x, a, b in zip("qkv", g_f[1:], g_d[1:], strict=True)]
            for what, a, b in named:
                chk.expect(prop, f"backward {what}:", a, b, where, atol=1e-5, rtol=1e-4)
            for what, a, _ in named[: len(params_f)]:
                if not np.any(np.asarray(a) != 0):
                    raise chk.fail(prop, f"parameter {what} gets no gradient", where)
        if not ran:
            raise chk.fail(prop, "it ran at none of the settings " + ", ".join(names), "")


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
    alone = [chk.run("jit and vmapped seeds", s.where(seed=i), everything, *splits[i], *inputs[i]) for i in (0, 1)]
    stack = jax.tree.map(lambda *xs: jnp.stack(xs), (*splits[0], *inputs[0]), (*splits[1], *inputs[1]))
    vmapped = chk.run("jit and vmapped seeds", s.where(seeds=2), jax.jit(jax.vmap(everything)), *stack)
    for i in (0, 1):
        one = jax.tree.map(lambda x, i=i: x[i], vmapped)
        prop = "jit and vmapped seeds equal to each seed alone"
        _same_tree(chk, prop, one, alone[i], s.where(seed=i), atol=1e-5, rtol=1e-5)


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
