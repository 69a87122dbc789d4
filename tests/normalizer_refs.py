"""Float64 numpy references for the attention normalizers, written from the documented formulas
(configs/normalizer/*.yaml, /work/shared/LITERATURE.md), independently of src/attnlab/normalizers.

Every reference loops over rows and works on the admissible keys of the row only; a row with no
admissible key gets all-zero weights (the `Normalizer` contract). A reference returns
(weights_BNTS, logits_BNTS, extras), `logits` being what the normalizer reports `max_logit` of.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.config import registry

# ---------------------------------------------------------------------------------------------
# shared pieces


def admissible(B, T, S, key_valid_BS=None, dense_BTS=None, causal=False):
    """(B,T,S) bool: causal (queries are the last T of S) ∧ key padding ∧ dense mask."""
    m = np.ones((B, T, S), bool)
    for t in range(T):
        for s in range(S):
            if causal and s > t + (S - T):
                m[:, t, s] = False
    if key_valid_BS is not None:
        m &= np.asarray(key_valid_BS, bool)[:, None, :]
    if dense_BTS is not None:
        m &= np.asarray(dense_BTS, bool)
    return m


def scores(q_BTNH, k_BSNH):
    return np.einsum("btnh,bsnh->bnts", np.asarray(q_BTNH, np.float64), np.asarray(k_BSNH, np.float64))


def options(name, **overrides):
    """YAML defaults updated by overrides (the documented option values)."""
    raw = registry.load("normalizer", name)
    opts = {k: v for k, v in raw.items() if not k.startswith("_")}
    opts.update(overrides)
    return opts


def beta_of(opts, H):
    return 1.0 / math.sqrt(H) if opts.get("beta") is None else float(opts["beta"])


def rowwise(fn, x_BNTS, m_BTS):
    """Apply fn(x_admissible, b, n, t) -> weights_admissible to every row with ≥ 1 admissible key."""
    B, N, T, S = x_BNTS.shape
    w = np.zeros_like(x_BNTS, dtype=np.float64)
    for b in range(B):
        for n in range(N):
            for t in range(T):
                idx = np.flatnonzero(m_BTS[b, t])
                if idx.size:
                    w[b, n, t, idx] = fn(x_BNTS[b, n, t, idx], b, n, t, idx)
    return w


def row_mean(x_BNT, m_BTS):
    """Per-head mean over rows with ≥ 1 admissible key (0 if there is none)."""
    ok = np.broadcast_to(m_BTS.any(-1)[:, None, :], x_BNT.shape)
    return np.where(ok, x_BNT, 0).sum((0, 2)) / np.maximum(ok.sum((0, 2)), 1)


def core_stats(w_BNTS, logits_BNTS, m_BTS):
    """CORE_STATS from their definitions, one row at a time."""
    B, N, T, S = w_BNTS.shape
    ent = [[] for _ in range(N)]
    mx = [[] for _ in range(N)]
    mass = [[] for _ in range(N)]
    maxlog = np.zeros(N)
    for b in range(B):
        for n in range(N):
            for t in range(T):
                idx = np.flatnonzero(m_BTS[b, t])
                if not idx.size:
                    continue
                p = w_BNTS[b, n, t, idx]
                mx[n].append(p.max())
                mass[n].append(p.sum())
                maxlog[n] = max(maxlog[n], np.abs(logits_BNTS[b, n, t, idx]).max())
                if idx.size >= 2 and p.sum() > 0:
                    r = p / p.sum()
                    r = r[r > 0]
                    ent[n].append(-(r * np.log(r)).sum() / math.log(idx.size))
    mean = lambda xs: np.array([np.mean(x) if x else 0.0 for x in xs])  # noqa: E731
    return {"entropy": mean(ent), "max_weight": mean(mx), "row_mass": mean(mass), "max_logit": maxlog}


# ---------------------------------------------------------------------------------------------
# simplex projections


def softmax_np(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def sparsemax_np(z):
    """Martins & Astudillo 2016: sort, support size k, threshold τ."""
    zs = np.sort(z)[::-1]
    cs = np.cumsum(zs)
    k = max(j for j in range(1, z.size + 1) if 1 + j * zs[j - 1] > cs[j - 1])
    tau = (cs[k - 1] - 1) / k
    return np.maximum(z - tau, 0)


def entmax_bisect_np(z, alpha, iters=200):
    """α-entmax: p = [(α−1)z − τ]₊^{1/(α−1)} with τ found by float64 bisection so Σp = 1."""
    x = (alpha - 1) * np.asarray(z, np.float64)
    lo, hi = x.max() - 1.0, x.max()  # mass(lo) ≥ 1, mass(hi) = 0
    mass = lambda tau: (np.maximum(x - tau, 0) ** (1 / (alpha - 1))).sum()  # noqa: E731
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mass(mid) >= 1 else (lo, mid)
    p = np.maximum(x - (lo + hi) / 2, 0) ** (1 / (alpha - 1))
    return p / p.sum()


def entmax_np(z, alpha):
    return sparsemax_np(z) if alpha == 2 else entmax_bisect_np(z, alpha)


# ---------------------------------------------------------------------------------------------
# per-normalizer references: ref(q, k, m_BTS, module, **opts)


def _beta_N(opts, H, N):
    return np.full(N, beta_of(opts, H))


# Veličković et al. 2024 (arXiv 2410.01104), their code: β' = polyval([-0.037, 0.481, -2.3, 4.917, -1.791], H)
POLY_FIT = (-0.037, 0.481, -2.3, 4.917, -1.791)


def adaptive_beta_np(x):
    """β' of one row of softmax logits: max(poly(H), 1) where H = −Σp log(p + 1e−9) > 0.5, else 1."""
    p = softmax_np(x)
    h = -np.sum(p * np.log(p + 1e-9))
    return max(float(np.polyval(POLY_FIT, h)), 1.0) if h > 0.5 else 1.0


def tempered(x, m, extras, adaptive):
    """(weights, logits, extras) of softmax over the admissible keys of x, with the adaptive temperature
    unless `adaptive` is off (then β' = 1 and no adaptive_beta is reported)."""
    if adaptive == "off":
        return rowwise(lambda r, *_: softmax_np(r), x, m), x, extras
    B, N, T, _ = x.shape
    beta = np.ones((B, N, T))
    for b, n, t in np.ndindex(B, N, T):
        if m[b, t].any():
            beta[b, n, t] = adaptive_beta_np(x[b, n, t, m[b, t]])
    xt = beta[..., None] * x
    return rowwise(lambda r, *_: softmax_np(r), xt, m), xt, {**extras, "adaptive_beta": row_mean(beta, m)}


def ref_softmax(q, k, m, module, **opts):
    N, H = q.shape[2], q.shape[3]
    x = beta_of(opts, H) * scores(q, k)
    return tempered(x, m, {"beta": _beta_N(opts, H, N)}, opts["adaptive_temperature"])


def kl_log_prior(m_BTS, N, prior, slope=0.1, table_NK=None, max_distance=512):
    """log u (B,N,T,S), normalised over the admissible keys of each row; −inf elsewhere.

    recency: log u ∝ −λ|i − j| with query i at position t + S − T; learned: table[h, clip(i − j)].
    """
    B, T, S = m_BTS.shape
    raw = np.zeros((B, N, T, S))
    for t in range(T):
        for s in range(S):
            d = t + (S - T) - s
            for n in range(N):
                if prior == "recency":
                    lam = slope[n] if np.ndim(slope) else slope
                    raw[:, n, t, s] = -lam * abs(d)
                elif prior == "learned":
                    M = max_distance
                    raw[:, n, t, s] = 0.0 if table_NK is None else table_NK[n, min(max(d, -(M - 1)), M - 1) + M - 1]
    logu = np.full_like(raw, -np.inf)
    for b in range(B):
        for t in range(T):
            idx = np.flatnonzero(m_BTS[b, t])
            if idx.size:
                r = raw[b, :, t, idx]  # (len(idx), N)
                lse = np.log(np.exp(r - r.max(0)).sum(0)) + r.max(0)
                logu[b, :, t, idx] = r - lse
    return logu


def ref_kl(q, k, m, module, table_NK=None, **opts):
    N, H = q.shape[2], q.shape[3]
    beta = beta_of(opts, H)
    z = scores(q, k)
    logu = kl_log_prior(m, N, opts["prior"], opts["slope"], table_NK, opts["max_distance"])
    w = rowwise(lambda r, b, n, t, idx: softmax_np(r + logu[b, n, t, idx]), beta * z, m)
    B, _, T, _ = z.shape
    kl = np.zeros((B, N, T))
    obj = np.zeros((B, N, T))
    for b in range(B):
        for n in range(N):
            for t in range(T):
                idx = np.flatnonzero(m[b, t])
                if idx.size:
                    p, lu = w[b, n, t, idx], logu[b, n, t, idx]
                    kl[b, n, t] = np.sum(np.where(p > 0, p * (np.log(np.where(p > 0, p, 1)) - lu), 0))
                    obj[b, n, t] = p @ z[b, n, t, idx] - kl[b, n, t] / beta
    extras = {"beta": _beta_N(opts, H, N), "kl_prior": row_mean(kl, m), "objective": row_mean(obj, m)}
    if opts["adaptive_temperature"] != "off":  # the temperature acts on π's logits βz + log u; KL stays π's
        return tempered(np.where(m[:, None], beta * z + logu, 0.0), m, extras, opts["adaptive_temperature"])
    return w, beta * z, extras


def ref_softmax1(q, k, m, module, **opts):
    N, H = q.shape[2], q.shape[3]
    x = beta_of(opts, H) * scores(q, k)
    # exp(xᵢ)/(1 + Σexp(xⱼ)) = exp(xᵢ − log(1 + Σexp(xⱼ))), the log computed stably in float64.
    f = lambda r, *_: np.exp(r - np.logaddexp(0.0, np.logaddexp.reduce(r)))  # noqa: E731
    return rowwise(f, x, m), x, {"beta": _beta_N(opts, H, N)}


def ref_sigmoid(q, k, m, module, **opts):
    N, H = q.shape[2], q.shape[3]
    bz = beta_of(opts, H) * scores(q, k)
    n_BT = np.maximum(m.sum(-1), 1)
    bias = -np.log(n_BT)[:, None, :, None] if opts.get("bias") is None else float(opts["bias"])
    x = bz + bias
    return rowwise(lambda r, *_: 1 / (1 + np.exp(-r)), x, m), x, {"beta": _beta_N(opts, H, N)}


def ref_relu(q, k, m, module, **opts):
    N, H = q.shape[2], q.shape[3]
    x = beta_of(opts, H) * scores(q, k)
    return rowwise(lambda r, *_: np.maximum(r, 0) / r.size, x, m), x, {"beta": _beta_N(opts, H, N)}


def ref_squared(q, k, m, module, **opts):
    N, H = q.shape[2], q.shape[3]
    x = beta_of(opts, H) * scores(q, k)
    p, eps = opts["power"], opts["eps"]
    if opts["offset"]:
        f = lambda r: sum(r**j / math.factorial(j) for j in range(p + 1))  # noqa: E731
    else:
        f = lambda r: np.abs(r) ** p  # noqa: E731
    w = rowwise(lambda r, *_: f(r) / (f(r).sum() + eps), x, m)
    den = np.full(N, np.inf)
    for b, n, t in np.ndindex(x.shape[:3]):
        if m[b, t].any():
            den[n] = min(den[n], f(x[b, n, t, m[b, t]]).sum())
    return w, x, {"beta": _beta_N(opts, H, N), "min_denominator": den}


def linear_features(x_BTNH, feature_map, omega_FH=None, is_query=False):
    x = np.asarray(x_BTNH, np.float64)
    if feature_map == "elu1":
        return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))
    if feature_map == "relu":
        return np.maximum(x, 0)
    # FAVOR+: m^{-1/2}(exp(ωᵀx′ − ‖x′‖²/2 − c) + 1e-6), x′ = x d^{-1/4}, c = per-query max (queries), 0 (keys)
    w = np.asarray(omega_FH, np.float64)
    mF, d = w.shape
    xs = x * d**-0.25
    lg = xs @ w.T - 0.5 * (xs**2).sum(-1, keepdims=True)
    if is_query:
        lg = lg - lg.max(-1, keepdims=True)
    return (np.exp(lg) + 1e-6) / math.sqrt(mF)


def ref_linear(q, k, m, module, **opts):
    N = q.shape[2]
    omega = np.asarray(module.omega[...]) if opts["feature_map"] == "favor" else None
    qf = linear_features(q, opts["feature_map"], omega, True)
    kf = linear_features(k, opts["feature_map"], omega, False)
    a = np.einsum("btnf,bsnf->bnts", qf, kf) * m[:, None]
    w = rowwise(lambda r, *_: r / (r.sum() + opts["eps"]), a, m)
    den = np.full(N, np.inf)
    for b, n, t in np.ndindex(a.shape[:3]):
        if m[b, t].any():
            den[n] = min(den[n], a[b, n, t].sum())
    return w, a, {"min_denominator": den}


def ref_entmax(q, k, m, module, **opts):
    N, H = q.shape[2], q.shape[3]
    x = beta_of(opts, H) * scores(q, k)
    return rowwise(lambda r, *_: entmax_np(r, float(opts["alpha"])), x, m), x, {"beta": _beta_N(opts, H, N)}


def ref_ssmax(q, k, m, module, **opts):
    """softmax((s·log n + b)·βz) over the n admissible keys of each row (Nakanishi 2025), s and b per head."""
    N, H = q.shape[2], q.shape[3]
    beta = beta_of(opts, H)
    s_N = np.broadcast_to(np.asarray(opts["s"], np.float64), (N,))
    b_N = np.broadcast_to(np.asarray(opts.get("b", 0.0), np.float64), (N,))
    z = scores(q, k)
    B, _, T, S = z.shape
    x, eff = np.zeros_like(z), np.zeros((B, N, T))
    for b, n, t in np.ndindex(B, N, T):
        eff[b, n, t] = beta * (s_N[n] * math.log(max(m[b, t].sum(), 1)) + b_N[n])
        x[b, n, t] = eff[b, n, t] * z[b, n, t]
    extras = {"s": s_N.copy(), "beta": row_mean(eff, m)}
    if opts["bias"]:
        extras["bias"] = b_N.copy()
    return rowwise(lambda r, *_: softmax_np(r), x, m), x, extras


def ref_stickbreaking(q, k, m, module, **opts):
    """A_ij = σ(x_ij)·∏_{k admissible, j<k} (1 − σ(x_ik)), x = βz, as a plain product over the row's keys
    (the query's own position left out unless attend_current)."""
    N, H = q.shape[2], q.shape[3]
    x = beta_of(opts, H) * scores(q, k)
    S, T = x.shape[-1], x.shape[-2]
    sig = lambda r: 1 / (1 + np.exp(-r))  # noqa: E731

    def row(r, b, n, t, idx):
        keep = np.ones(idx.size, bool) if opts["attend_current"] else idx != t + (S - T)
        w = np.zeros(idx.size)
        for a in np.flatnonzero(keep):
            later = [c for c in np.flatnonzero(keep) if idx[c] > idx[a]]
            w[a] = sig(r[a]) * np.prod([1 - sig(r[c]) for c in later])
        return w

    w = rowwise(row, x, m)
    return w, x, {"beta": _beta_N(opts, H, N), "leftover": row_mean(1 - w.sum(-1), m)}


# name -> (reference, how a row with admissible keys sums: "one" | "at_most_one" | "free")
REFS = {
    "softmax": (ref_softmax, "one"),
    "kl": (ref_kl, "one"),
    "softmax1": (ref_softmax1, "at_most_one"),
    "sigmoid": (ref_sigmoid, "free"),  # n/(n+1) at zero logits, up to n once logits are large
    "relu": (ref_relu, "free"),  # relu(βz)/n sums to the mean of relu(βz): > 1 once logits are > 1
    "squared": (ref_squared, "one"),  # Σf/(Σf + eps) ∈ [1 − eps/min_denominator, 1]
    "linear": (ref_linear, "one"),
    "entmax": (ref_entmax, "one"),
    "ssmax": (ref_ssmax, "one"),
    "stickbreaking": (ref_stickbreaking, "at_most_one"),
}


# ---------------------------------------------------------------------------------------------
# test cases shared by the test modules

B, N, H = 2, 3, 5

# Option variants per normalizer; a normalizer missing here runs with its YAML defaults (and
# fails the reference tests until REFS has an entry for it).
VARIANTS = {
    "softmax": {
        "default": {},
        "beta0.7-shared": {"beta": 0.7, "per_head": False},
        "adaptive-eval": {"adaptive_temperature": "eval"},
    },
    "kl": {
        "uniform": {"prior": "uniform"},
        "recency": {"prior": "recency", "slope": 0.3},
        "learned": {"prior": "learned", "max_distance": 4},
        "recency-adaptive": {"prior": "recency", "slope": 0.3, "adaptive_temperature": "eval"},
    },
    "softmax1": {"default": {}},
    "sigmoid": {"default": {}, "bias-1.5": {"bias": -1.5}},
    "relu": {"default": {}},
    "squared": {
        "plain": {},
        "offset": {"offset": True},
        "eps0": {"eps": 0.0},
        "eps0.1": {"eps": 0.1},
        "power3": {"power": 3},
        "offset-power4": {"offset": True, "power": 4},
    },
    # favor with F = H shares compiled shapes with elu1 (F ≠ H and several chunk sizes are
    # covered by test_linear_attention_forms_agree)
    "linear": {"elu1": {}, "relu": {"feature_map": "relu"}, "favor": {"feature_map": "favor", "num_features": 5}},
    "entmax": {"alpha1.5": {"alpha": 1.5}, "alpha2": {"alpha": 2.0}, "alpha1.3": {"alpha": 1.3}},
    "ssmax": {"default": {}, "s1.5-bias": {"s": 1.5, "bias": True, "beta": 0.6}},
    "stickbreaking": {"default": {}, "attend_current-beta1": {"attend_current": True, "beta": 1.0}},
}

# Normalizers that refuse a bidirectional mask (class attribute `causal_only`): their reference cases run on the
# causal mask settings only.
CAUSAL_ONLY = tuple(
    name
    for name in registry.choices("normalizer")
    if getattr(
        registry.resolve_target(registry.load("normalizer", name)["_target_"], "normalizer"), "causal_only", False
    )
)


def cases():
    """[(name, variant_id, options)] over every normalizer the registry lists."""
    return [
        (name, vid, opts)
        for name in registry.choices("normalizer")
        for vid, opts in VARIANTS.get(name, {"default": {}}).items()
    ]


def case_id(case):
    return f"{case[0]}-{case[1]}"


def mask_arrays(kind):
    """(T, S, key_valid_BS | None, dense_BTS | None, causal) of a named mask setting.

    none/pad: cross attention T=7, S=11; causal_pad: T=S=13 with right padding (batch 0) and left
    padding (batch 1, so its first rows have no admissible key); causal_cross: T=7 < S=11 causal
    (queries are the last T); dense: an explicit random mask with an empty row, plus padding;
    grad: T=S=13 causal with padding but no empty row.
    """
    rng = np.random.default_rng(101)
    if kind == "none":
        return 7, 11, None, None, False
    if kind == "pad":
        valid = np.ones((B, 11), bool)
        valid[0, 8:] = False
        valid[1, [0, 4, 5]] = False
        return 7, 11, valid, None, False
    if kind == "causal_pad":
        valid = np.ones((B, 13), bool)
        valid[0, 11:] = False
        valid[1, :3] = False
        valid[1, 7] = False
        return 13, 13, valid, None, True
    if kind == "causal_cross":
        return 7, 11, None, None, True
    if kind == "dense":
        dense = rng.random((B, 7, 11)) < 0.6
        dense[0, 2] = False
        dense[1, 4] = False
        dense[1, 4, 6] = True  # a row with a single admissible key
        valid = np.ones((B, 11), bool)
        valid[1, 9:] = False
        return 7, 11, valid, dense, False
    if kind == "grad":
        valid = np.ones((B, 13), bool)
        valid[0, 10:] = False
        valid[1, [2, 7]] = False
        return 13, 13, valid, None, True
    raise KeyError(kind)


MASK_KINDS = ("none", "pad", "causal_pad", "causal_cross", "dense")
EMPTY_ROW_MASKS = ("causal_pad", "dense")


def qkv(seed, T, S, scale=1.0):
    rng = np.random.default_rng(seed)
    q = (scale * rng.normal(size=(B, T, N, H))).astype(np.float32)
    k = rng.normal(size=(B, S, N, H)).astype(np.float32)
    v = rng.normal(size=(B, S, N, H)).astype(np.float32)
    return q, k, v


def make_mask(kind):
    """(T, S, Mask, admissible (B,T,S) numpy bool) of a named mask setting."""
    T, S, valid, dense, causal = mask_arrays(kind)
    mask = nz.Mask(
        key_valid_BS=None if valid is None else jnp.asarray(valid),
        dense_BTS=None if dense is None else jnp.asarray(dense),
        causal=causal,
    )
    return T, S, mask, admissible(B, T, S, valid, dense, causal)


class TokenMajor(nnx.Module):
    """A normalizer seen in jax.nn.dot_product_attention's (B,T,N,H) layout, which these references
    use: transposes to the heads-major contract (B,N,T,H) and back; other attributes pass through."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        if name.startswith("_") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, q_BTNH, k_BSNH, v_BSNH, mask, **kwargs):
        out_BNTH, stats = self.inner(*(jnp.swapaxes(x, 1, 2) for x in (q_BTNH, k_BSNH, v_BSNH)), mask, **kwargs)
        return jnp.swapaxes(out_BNTH, 1, 2), stats

    def weights(self, q_BTNH, k_BSNH, mask):
        return self.inner.weights(jnp.swapaxes(q_BTNH, 1, 2), jnp.swapaxes(k_BSNH, 1, 2), mask)


def build(name, opts):
    """The named normalizer, called with (B,T,N,H) operands like the references (TokenMajor)."""
    return TokenMajor(config.normalizer(name, num_heads=N, head_dim=H, rngs=nnx.Rngs(0), **opts))
