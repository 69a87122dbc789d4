"""Float64 numpy pieces shared by the normalizers' `reference` methods (the formulas, written independently of
the JAX forms; each normalizer's own reference sits beside it in its module, as fla keeps naive.py per kernel).

A reference works row by row on the admissible keys of the row only; a row with no admissible key gets all-zero
weights (the `Normalizer` contract). Operands are heads-major: q (B,N,T,H), k (B,N,S,H), admissible (B,T,S).
"""

from __future__ import annotations

import math

import numpy as np

# Veličković et al. 2024 (arXiv 2410.01104), their code: β' = polyval([-0.037, 0.481, -2.3, 4.917, -1.791], H)
POLY_FIT = (-0.037, 0.481, -2.3, 4.917, -1.791)


def admissible(B, T, S, key_valid_BS=None, dense_BTS=None, causal=False, window=None):
    """(B,T,S) bool: causal (queries are the last T of S) ∧ window (|i − j| < window) ∧ key padding ∧ dense mask."""
    m = np.ones((B, T, S), bool)
    for t in range(T):
        for s in range(S):
            i = t + (S - T)
            if (causal and s > i) or (window is not None and abs(i - s) >= window):
                m[:, t, s] = False
    if key_valid_BS is not None:
        m &= np.asarray(key_valid_BS, bool)[:, None, :]
    if dense_BTS is not None:
        m &= np.asarray(dense_BTS, bool)
    return m


def scores(q_BNTH, k_BNSH):
    """z = q·kᵀ in float64, (B,N,T,S)."""
    return np.einsum("bnth,bnsh->bnts", np.asarray(q_BNTH, np.float64), np.asarray(k_BNSH, np.float64))


def output(norm, w_BNTS, v_BNSH):
    """The float64 output the reference weights make: w·v, or the normalizer's own `reference_output(w, v)` where
    its output is not the weighted sum alone (differential attention's per-head RMS norm after it)."""
    w, v = np.asarray(w_BNTS, np.float64), np.asarray(v_BNSH, np.float64)
    own = getattr(norm, "reference_output", None)
    return np.asarray(own(w, v), np.float64) if callable(own) else np.einsum("bnts,bnsh->bnth", w, v)


def inverse_temperature(module, N):
    """β (N,) in float64 from a module's `InverseTemperature` (β = exp θ)."""
    return np.broadcast_to(np.exp(np.asarray(module.beta.theta[...], np.float64)), (N,)).copy()


def rowwise(fn, x_BNTS, m_BTS):
    """Apply fn(x_admissible, b, n, t, idx) -> weights_admissible to every row with ≥ 1 admissible key."""
    B, N, T, S = x_BNTS.shape
    w = np.zeros(x_BNTS.shape, np.float64)
    for b, n, t in np.ndindex(B, N, T):
        idx = np.flatnonzero(m_BTS[b, t])
        if idx.size:
            w[b, n, t, idx] = fn(x_BNTS[b, n, t, idx], b, n, t, idx)
    return w


def row_mean(x_BNT, m_BTS):
    """Per-head mean over rows with ≥ 1 admissible key (0 if there is none)."""
    ok = np.broadcast_to(m_BTS.any(-1)[:, None, :], x_BNT.shape)
    return np.where(ok, x_BNT, 0).sum((0, 2)) / np.maximum(ok.sum((0, 2)), 1)


def core_stats(w_BNTS, logits_BNTS, m_BTS, q_pos_T=None):
    """CORE_STATS from their definitions, one row at a time: entropy (nats / log n, rows renormalised, rows with
    n < 2 or zero mass left out), largest weight, weight on the first admissible key, row mass (means over rows
    with a key), weight on the row's own position (rows that may see it; queries at q_pos_T, default the last T of
    the S keys) and max |logit|."""
    B, N, T, S = w_BNTS.shape
    q_pos_T = np.arange(T) + (S - T) if q_pos_T is None else np.asarray(q_pos_T)
    ent, mx, mass, first, own = ([[] for _ in range(N)] for _ in range(5))
    maxlog = np.zeros(N)
    for b, n, t in np.ndindex(B, N, T):
        idx = np.flatnonzero(m_BTS[b, t])
        if not idx.size:
            continue
        if q_pos_T[t] in idx:
            own[n].append(w_BNTS[b, n, t, q_pos_T[t]])
        p = w_BNTS[b, n, t, idx]
        first[n].append(p[0])
        mx[n].append(p.max())
        mass[n].append(p.sum())
        maxlog[n] = max(maxlog[n], np.abs(logits_BNTS[b, n, t, idx]).max())
        if idx.size >= 2 and p.sum() > 0:
            r = p / p.sum()
            r = r[r > 0]
            ent[n].append(-(r * np.log(r)).sum() / math.log(idx.size))

    def mean(xs):
        return np.array([np.mean(x) if x else 0.0 for x in xs])

    return {
        "entropy": mean(ent),
        "max_weight": mean(mx),
        "first_weight": mean(first),
        "self_weight": mean(own),
        "row_mass": mean(mass),
        "max_logit": maxlog,
    }


def sink_rate(first_weight_LN, epsilon=0.3):
    """Gu et al. 2024: per layer, the share of heads whose mean first-token weight exceeds ε."""
    return (np.asarray(first_weight_LN, np.float64) > epsilon).mean(-1)


def residual_outliers(x_BTD, valid_BT):
    """(largest |x| / median |x|, kurtosis E[(x − μ)⁴] / σ⁴) over every entry of the valid tokens, in float64."""
    v = np.asarray(x_BTD, np.float64)[np.asarray(valid_BT, bool)].ravel()
    a = np.abs(v)
    c = v - v.mean()
    return a.max() / np.median(a), (c**4).mean() / (c**2).mean() ** 2


def softmax_np(x):
    """softmax of one row."""
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

    def mass(tau):
        return (np.maximum(x - tau, 0) ** (1 / (alpha - 1))).sum()

    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mass(mid) >= 1 else (lo, mid)
    p = np.maximum(x - (lo + hi) / 2, 0) ** (1 / (alpha - 1))
    return p / p.sum()


def entmax_np(z, alpha):
    """α-entmax of one row (sparsemax at α = 2)."""
    return sparsemax_np(z) if alpha == 2 else entmax_bisect_np(z, alpha)


def adaptive_beta_np(x):
    """β' of one row of softmax logits: max(poly(H), 1) where H = −Σp log(p + 1e−9) > 0.5, else 1."""
    p = softmax_np(x)
    h = -np.sum(p * np.log(p + 1e-9))
    return max(float(np.polyval(POLY_FIT, h)), 1.0) if h > 0.5 else 1.0


def tempered(x_BNTS, m_BTS, extras, adaptive):
    """(weights, logits, extras) of softmax over the admissible keys of x, each row at its adaptive temperature
    unless `adaptive` is "off" (then β' = 1 and no adaptive_beta is reported)."""
    if adaptive == "off":
        return rowwise(lambda r, *_: softmax_np(r), x_BNTS, m_BTS), x_BNTS, extras
    B, N, T, _ = x_BNTS.shape
    beta = np.ones((B, N, T))
    for b, n, t in np.ndindex(B, N, T):
        if m_BTS[b, t].any():
            beta[b, n, t] = adaptive_beta_np(x_BNTS[b, n, t, m_BTS[b, t]])
    xt = beta[..., None] * x_BNTS
    return rowwise(lambda r, *_: softmax_np(r), xt, m_BTS), xt, {**extras, "adaptive_beta": row_mean(beta, m_BTS)}


def min_row_sum(x_BNTS, m_BTS):
    """Per head, the least Σ over admissible keys of a row that has one (inf if none has)."""
    B, N, T, _ = x_BNTS.shape
    out = np.full(N, np.inf)
    for b, n, t in np.ndindex(B, N, T):
        if m_BTS[b, t].any():
            out[n] = min(out[n], x_BNTS[b, n, t, m_BTS[b, t]].sum())
    return out
