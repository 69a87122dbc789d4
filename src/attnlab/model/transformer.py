"""A pre-LayerNorm transformer whose attention normalizer is pluggable; returns features and per-layer stats."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax.numpy as jnp
from flax import nnx

from attnlab import checks
from attnlab.backends.impl import Workload
from attnlab.model.backward import take_rows
from attnlab.model.block import Block, make_norm
from attnlab.model.groups import tag
from attnlab.model.remat import run_blocks
from attnlab.normalizers import Mask, Normalizer
from attnlab.options import model as model_options
from attnlab.statistics.residual import residual_statistics


def sinusoidal_table(length: int, d_model: int):
    """Fixed sin/cos table (Vaswani et al. 2017)."""
    pos = jnp.arange(length)[:, None]
    inv = jnp.exp(-math.log(10000.0) * jnp.arange(0, d_model, 2) / d_model)
    table = jnp.zeros((length, d_model))
    table = table.at[:, 0::2].set(jnp.sin(pos * inv))
    return table.at[:, 1::2].set(jnp.cos(pos * inv)[:, : d_model // 2])


def stack_layer_stats(per_layer: list[dict]) -> dict:
    """{key: (L, N)} over the union of the layers' keys; NaN where a layer's normalizer lacks the key."""
    keys = list(dict.fromkeys(k for s in per_layer for k in s))
    like_N = next(v for s in per_layer for v in s.values())  # every statistic is per head, (N,)
    return {k: jnp.stack([s[k] if k in s else jnp.full_like(like_N, jnp.nan) for s in per_layer]) for k in keys}


# Beyond this many parameters no machine can hold the model (10^10 float32 = 40 GB before optimizer state).
MAX_PARAMS = 10**10


def check_size(*, d_model: int, layers: int, mlp_ratio: int, max_len: int, vocab_size, input_dim) -> None:
    """The model's parameter count with the task's inputs (vocab_size or input_dim), at most MAX_PARAMS."""
    table = (vocab_size or input_dim or 0) + max_len
    params = layers * (4 + 2 * mlp_ratio) * d_model**2 + table * d_model
    checks.require(
        params <= MAX_PARAMS,
        f"model.d_model={d_model}, model.layers={layers}, model.mlp_ratio={mlp_ratio}, "
        f"model.max_len={max_len} make ~{params:.2g} parameters; "
        f"allowed: at most {MAX_PARAMS:.0e}",
    )


class Transformer(nnx.Module):
    """Inputs (token ids (B,T) or vectors (B,T,I)) + valid_BT → (features, stats).

    features are (B,T,D) per token, or (B,D) with `pooled` (mean over valid tokens). stats maps
    each per-head statistic to an (L, N) array (empty unless `with_stats`): the union of the keys of
    every layer's normalizer, NaN for a layer whose normalizer does not report that statistic.

    `make_normalizer` is one factory, or a sequence of them cycled over the layers (hybrids);
    `window` (None: off) limits each query to its `window` nearest admissible keys (Mask.window);
    `short_conv` (0: off) is the width of a short convolution on q, k, v (attention.ShortConv);
    `remat` (false | true | "dots") recomputes each block in the backward pass (attnlab.model.remat);
    `output_gate` (none | headwise | elementwise) gates each head's output (options.model.OUTPUT_GATES);
    `embed_std` (None: each table's own init) is the std of the token and learned-position tables' normal init;
    `bias` (None: the MLP kind's own, block.mlp_bias) gives the MLP's and a vector input's linear layers biases;
    `extreme_token_stats` adds the residual stream's statistics to `stats` (statistics.residual, from each block's
    output and value norms): they are opt-in because their medians cost the logging step's compile (BENCHMARKS.md).

    Given `batch_size` (the sequences a device holds in a step), each layer's attention backend is chosen here,
    once, at seq_len and each of `test_lengths` (choose_backends); without it, on a layer's first trace.
    """

    def __init__(
        self,
        *,
        d_model: int,
        heads: int,
        layers: int,
        mlp_ratio: int,
        dropout: float,
        positional: str,
        max_len: int,
        causal: bool,
        qk_norm: bool,
        pooled: bool,
        make_normalizer: Callable[..., Normalizer] | Sequence[Callable[..., Normalizer]],
        seq_len: int,
        vocab_size: int | None = None,
        input_dim: int | None = None,
        dtype=jnp.float32,
        window: int | None = None,
        short_conv: int = 0,
        output_gate: str = "none",
        extreme_token_stats: bool | None = False,
        norm: str = "layernorm",
        mlp: str = "gelu",
        embed_std: float | None = None,
        bias: bool | None = None,
        remat: bool | str = False,
        batch_size: int | None = None,
        test_lengths: Sequence[int] = (),
        rngs: nnx.Rngs,
    ):
        model_options.transformer(  # each option's range, one line naming it
            d_model=d_model,
            heads=heads,
            layers=layers,
            mlp_ratio=mlp_ratio,
            dropout=dropout,
            max_len=max_len,
            qk_norm=qk_norm,
            positional=positional,
            remat=remat,
            window=window,
            short_conv=short_conv,
            output_gate=output_gate,
            norm=norm,
            mlp=mlp,
            extreme_token_stats=extreme_token_stats,
            embed_std=embed_std,
            bias=bias,
        )
        check_size(
            d_model=d_model,
            layers=layers,
            mlp_ratio=mlp_ratio,
            max_len=max_len,
            vocab_size=vocab_size,
            input_dim=input_dim,
        )
        if positional in ("learned", "sinusoidal") and seq_len > max_len:
            raise checks.ConfigError(
                f"sequence length {seq_len} exceeds model.max_len={max_len} of the {positional} table"
            )
        if (vocab_size is None) == (input_dim is None):
            raise ValueError("exactly one of vocab_size (token inputs) and input_dim (vector inputs) is needed")
        makers = list(make_normalizer) if isinstance(make_normalizer, Sequence) else [make_normalizer]
        # embed_std None: flax's own table init (std ≈ d_model^-0.5) and GPT-2's 0.02 for learned positions
        token_init = {} if embed_std is None else {"embedding_init": nnx.initializers.normal(embed_std)}
        self.embed = (
            nnx.Embed(vocab_size, d_model, dtype=dtype, rngs=rngs, **token_init)
            if vocab_size
            else nnx.Linear(input_dim, d_model, use_bias=bias is not False, dtype=dtype, rngs=rngs)
        )
        self.positional, self.causal, self.pooled, self.dtype = positional, causal, pooled, dtype
        self.window, self.remat, self.extreme_token_stats = window, remat, bool(extreme_token_stats)
        if positional == "learned":
            pos_init = nnx.initializers.normal(0.02 if embed_std is None else embed_std)
            self.pos = nnx.Embed(max_len, d_model, embedding_init=pos_init, dtype=dtype, rngs=rngs)
        self.blocks = nnx.List(
            [
                Block(
                    d_model,
                    heads,
                    mlp_ratio,
                    dropout,
                    makers[i % len(makers)],
                    use_rope=positional == "rope",
                    qk_norm=qk_norm,
                    seq_len=seq_len,
                    dtype=dtype,
                    rngs=rngs,
                    short_conv=short_conv,
                    output_gate=output_gate,
                    norm=norm,
                    mlp=mlp,
                    bias=bias,
                )
                for i in range(layers)
            ]
        )
        for i, block in enumerate(self.blocks):  # e.g. differential attention's λ_init, by depth
            if block.attn.normalizer.takes_layer_index:
                block.attn.normalizer.set_layer_index(i)
        self.ln_f = make_norm(norm, d_model, dtype, rngs)
        tag("embedding", self.embed, *([self.pos] if positional == "learned" else []))
        tag("norm", self.ln_f)
        if batch_size is not None:
            self.choose_backends(batch_size, heads, sorted({seq_len, *test_lengths}))

    def choose_backends(self, batch_size: int, heads: int, lengths: Sequence[int]) -> None:
        """Record each layer's attention backend at each length (backends/impl.py); ConfigError if a layer's
        normalizer.impl cannot run here. Without remat every layer's score tensors wait for the backward at once."""
        workload = Workload(batch_size, heads, layers=1 if self.remat is True else len(self.blocks))
        for block in self.blocks:
            block.attn.normalizer.record_backends(lengths, self.mask_at, self.dtype, workload)

    def embed_inputs(self, inputs):
        """Token or vector embedding plus the additive positional encoding."""
        if isinstance(self.embed, nnx.Embed):
            x_BTD = take_rows(self.embed.embedding[...], inputs, self.dtype)
        else:
            x_BTD = self.embed(inputs).astype(self.dtype)
        T = x_BTD.shape[1]
        if self.positional == "learned":
            x_BTD = x_BTD + self.pos(jnp.arange(T))[None]
        elif self.positional == "sinusoidal":
            x_BTD = x_BTD + sinusoidal_table(T, x_BTD.shape[-1]).astype(self.dtype)[None]
        return x_BTD

    def mask(self, valid_BT) -> Mask:
        """The admissible keys; padding is right padding (the Task contract), so it is a key length."""
        return Mask(key_valid_BS=valid_BT, causal=self.causal, window=self.window, right_padded=True)

    def mask_at(self, T: int) -> Mask:
        """The mask of length-T sequences with no padding (what the backend choice depends on is its structure)."""
        return self.mask(jnp.ones((1, T), bool))

    def attention_impl(self, T: int) -> list[str]:
        """The backend each layer's plain step runs at sequence length T (run.json), as chosen at build."""
        return [b.attn.normalizer.backend(T, T, self.mask_at(T), self.dtype).name for b in self.blocks]

    def attention_maps(self, inputs, valid_BT):
        """Explicit (L, B, N, T, S) attention matrices, for diagnostics (images on eval steps)."""
        x_BTD = self.embed_inputs(inputs)
        mask = self.mask(valid_BT)
        maps = []
        for block in self.blocks:
            maps.append(block.attn.weights(block.ln1(x_BTD), mask))
            x_BTD, _, _ = block(x_BTD, mask, with_stats=False, score_probe_BNTS=None, deterministic=True, rngs=None)
        return jnp.stack(maps)

    def __call__(self, inputs, valid_BT, *, with_stats=False, score_probes=None, deterministic=True, rngs=None):
        x_BTD = self.embed_inputs(inputs)
        mask = self.mask(valid_BT)
        x_BTD, per_layer, outputs = run_blocks(
            self.blocks,
            x_BTD,
            mask,
            score_probes,
            rngs,
            remat=self.remat,
            with_stats=with_stats,
            deterministic=deterministic,
        )
        x_BTD = self.ln_f(x_BTD)
        stats = {}
        if with_stats:
            stats = stack_layer_stats(per_layer)
        if with_stats and self.extreme_token_stats:
            stats |= residual_statistics([x for x, _ in outputs], [v for _, v in outputs], valid_BT)
        if not self.pooled:
            return x_BTD, stats
        # The mean over T in float32 (a bfloat16 sum of T terms loses ~log2(T) bits); the head upcasts anyway.
        w_BT1 = valid_BT[..., None].astype(jnp.float32)
        return (x_BTD.astype(jnp.float32) * w_BT1).sum(1) / jnp.maximum(w_BT1.sum(1), 1), stats
