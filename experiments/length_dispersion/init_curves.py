"""Max weight and normalised entropy of each normalizer against the number of keys n on Nakanishi's (2025,
Figure 1) row: one logit +3 among n − 1 logits −2, by closed form and by `attnlab.config.attention_weights`.

Usage: python init_curves.py OUT_DIR   (writes OUT_DIR/init.md and OUT_DIR/init.png)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HIGH, LOW = 3.0, -2.0  # the row's one large logit and the n − 1 others (Nakanishi 2025, Figure 1)
SSMAX_S = 0.43  # ssmax's initial s (the paper's Figure 1; configs/normalizer/ssmax.yaml)
ADAPTIVE_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)  # Veličković et al. 2024, their code's degree-4 fit
NS = (2, 10, 100, 1000, 10000)

# name -> (attnlab normalizer, its options); the row's logits reach the normalizer as β·q·k with β = 1, q = 1.
NORMALIZERS = {
    "softmax": ("softmax", {}),
    "softmax, adaptive temperature": ("softmax", {"adaptive_temperature": "eval"}),
    "ssmax (s = 0.43)": ("ssmax", {"s": SSMAX_S}),
    "sigmoid (bias −log n)": ("sigmoid", {}),
    "stick-breaking, +3 most recent": ("stickbreaking", {"attend_current": True}),
    "stick-breaking, +3 oldest": ("stickbreaking", {"attend_current": True}),
}


def row(n: int, high_first: bool = True) -> np.ndarray:
    """n logits: −2 everywhere but one +3, at key 0 (the oldest) or, high_first=False, key n − 1 (the newest)."""
    z = np.full(n, LOW)
    z[0 if high_first else n - 1] = HIGH
    return z


def entropy_normalised(w: np.ndarray) -> float:
    """H(w / Σw) / log n: 1 = uniform, 0 = one key (attnlab's attn_entropy)."""
    p = w / w.sum()
    p = p[p > 0]
    return float(-(p * np.log(p)).sum() / np.log(len(w)))


def softmax_max(n: int, scale: float = 1.0) -> float:
    """softmax(scale·z)'s largest weight: e^{3a} / (e^{3a} + (n − 1) e^{−2a}) = 1 / (1 + (n − 1) e^{−5a})."""
    return 1.0 / (1.0 + (n - 1) * np.exp(-(HIGH - LOW) * scale))


def softmax_weights(z: np.ndarray, scale: float = 1.0) -> np.ndarray:
    e = np.exp(scale * (z - z.max()))
    return e / e.sum()


def adaptive_scale(z: np.ndarray) -> float:
    """β' = max(poly(H), 1) where H (nats) of softmax(z) exceeds 0.5, else 1 (Veličković et al. 2024)."""
    p = softmax_weights(z)
    h = float(-(p * np.log(p + 1e-9)).sum())
    return max(float(np.polyval(ADAPTIVE_POLY, h)), 1.0) if h > 0.5 else 1.0


def sigmoid_weights(z: np.ndarray) -> np.ndarray:
    """σ(z − log n): rows need not sum to 1 (the largest is σ(3 − log n) = 1 / (1 + n e^{−3}))."""
    return 1.0 / (1.0 + np.exp(-(z - np.log(len(z)))))


def stickbreaking_weights(z: np.ndarray) -> np.ndarray:
    """A_j = σ(z_j) ∏_{k > j} (1 − σ(z_k)): key n − 1 (the newest) breaks the stick first (Tan et al. 2024)."""
    s = 1.0 / (1.0 + np.exp(-z))
    later = np.concatenate([np.cumsum(np.log1p(-s)[::-1])[::-1][1:], [0.0]])  # Σ_{k > j} log(1 − σ(z_k))
    return s * np.exp(later)


def closed_form(name: str, n: int) -> np.ndarray:
    """The weights of the named normalizer on the row of n keys, in float64 numpy."""
    if name == "softmax":
        return softmax_weights(row(n))
    if name.startswith("softmax, adaptive"):
        return softmax_weights(row(n), adaptive_scale(row(n)))
    if name.startswith("ssmax"):
        return softmax_weights(row(n), SSMAX_S * np.log(n))
    if name.startswith("sigmoid"):
        return sigmoid_weights(row(n))
    return stickbreaking_weights(row(n, high_first=name.endswith("oldest")))


def library_weights(name: str, n: int) -> np.ndarray:
    """The same row through attnlab: the last query of a causal sequence of n keys (k = the logits, q = 1)."""
    import jax.numpy as jnp

    from attnlab.config import attention_weights

    normalizer, options = NORMALIZERS[name]
    k = jnp.asarray(row(n, high_first=not name.endswith("most recent")), jnp.float32).reshape(1, n, 1, 1)
    q = jnp.ones((1, n, 1, 1), jnp.float32)
    w = attention_weights(normalizer, q, k, causal=True, beta=1.0, learnable=False, **options)
    return np.asarray(w[0, 0, -1], np.float64)


def table() -> list[str]:
    """init.md: max weight and normalised entropy per normalizer and n (closed form)."""
    head = "| normalizer | " + " | ".join(f"n = {n}: max, entropy" for n in NS) + " |"
    lines = [head, "|---|" + "---|" * len(NS)]
    for name in NORMALIZERS:
        cells = []
        for n in NS:
            w = closed_form(name, n)
            cells.append(f"{w.max():.3f}, {entropy_normalised(w):.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def draw(path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ns = np.unique(np.geomspace(2, 1e4, 60).astype(int))
    fig = Figure(figsize=(9, 3.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for name in NORMALIZERS:
        ws = [closed_form(name, n) for n in ns]
        axes[0].plot(ns, [w.max() for w in ws], label=name)
        axes[1].plot(ns, [entropy_normalised(w) for w in ws], label=name)
    for ax, label in zip(axes, ("max weight", "normalised entropy")):
        ax.set(xscale="log", xlabel="keys n", ylabel=label, ylim=(0, 1.02))
    axes[0].set_title("row: one +3, n − 1 × −2 (closed forms)", fontsize="small")
    axes[1].legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(out_dir: str) -> None:
    out = Path(out_dir)
    (out / "init.md").write_text(
        "Max weight and normalised entropy H/log n at n keys on the row (+3, −2, …, −2), closed forms (β = 1;\n"
        f"ssmax s = {SSMAX_S}; stick-breaking with the query's own key in its row, the +3 newest or oldest).\n\n"
        + "\n".join(table())
        + "\n"
    )
    draw(out / "init.png")
    print((out / "init.md").read_text())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
