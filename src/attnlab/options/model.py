"""The model group's options (attnlab.model.Transformer), checked without jax."""

from __future__ import annotations

from attnlab import checks

POSITIONAL = ("learned", "sinusoidal", "rope", "none")
# The block's normalisation and MLP: GPT-2's (layernorm, gelu) or LLaMA's (rmsnorm, swiglu; Touvron et al. 2023,
# RMSNorm of Zhang & Sennrich 2019, SwiGLU of Shazeer 2020), the model the normalizer papers train at 60M-1B.
NORMS = ("layernorm", "rmsnorm")
# relu: the original transformer's ReLU MLP (Vaswani et al. 2017), as in Guo et al. 2024's Bigram-Backcopy model.
MLPS = ("gelu", "relu", "swiglu")
# Gated attention (Qiu et al. 2025, "Gated Attention for Large Language Models", arXiv 2505.06708, Eq. 5 at their
# position G1): each head's normalizer output times σ(X·W_θ), X the attention's (normalised) input, before the
# output projection. headwise: one gate per head and token (W_θ: D → N); elementwise: one per output channel
# (W_θ: D → N·H), the paper's best. No bias, as the paper's gate projection.
OUTPUT_GATES = ("none", "headwise", "elementwise")
# A short convolution (2-8 in Zoology/fla); its taps are unrolled, so a bound keeps compilation finite.
MAX_SHORT_CONV = 64


def transformer(
    *,
    d_model,
    heads,
    layers,
    mlp_ratio,
    dropout,
    max_len,
    qk_norm,
    positional,
    remat,
    window,
    short_conv,
    output_gate,
    norm,
    mlp,
    extreme_token_stats,
    embed_std,
    bias,
) -> None:
    """model=<any>: each option's range, and heads dividing d_model (the size the task adds is checked when built:
    model.transformer.check_size)."""
    d_model = checks.integer("model.d_model", d_model, 1)
    heads = checks.integer("model.heads", heads, 1)
    checks.integer("model.layers", layers, 1)
    checks.integer("model.mlp_ratio", mlp_ratio, 0)
    checks.real("model.dropout", dropout, 0.0, 1.0, hi_open=True)
    checks.integer("model.max_len", max_len, 1)
    checks.boolean("model.qk_norm", qk_norm)
    checks.choice("model.positional", positional, POSITIONAL)
    checks.choice("model.remat", remat, (False, True, "dots"))
    if window is not None:  # null: no window
        checks.integer("model.window", window, 1, 2**31 - 1)
    checks.integer("model.short_conv", short_conv, 0, MAX_SHORT_CONV)
    checks.choice("model.output_gate", output_gate, OUTPUT_GATES)
    checks.choice("model.norm", norm, NORMS)
    checks.choice("model.mlp", mlp, MLPS)
    if extreme_token_stats is not None:  # null: the task's (Task.measures_sinks)
        checks.boolean("model.extreme_token_stats", extreme_token_stats)
    if embed_std is not None:  # null: each table's own initialisation
        checks.real("model.embed_std", embed_std, 0.0, 1e6, lo_open=True)
    if bias is not None:  # null: the MLP kind's own (block.mlp_bias)
        checks.boolean("model.bias", bias)
    checks.require(
        d_model % heads == 0,
        f"model.d_model={d_model} is not divisible by model.heads={heads}; allowed: heads dividing d_model",
    )


DECLARED = {"attnlab.model.Transformer": (transformer,)}
