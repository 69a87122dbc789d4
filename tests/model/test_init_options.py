"""model.embed_std, model.bias and head.bias: the tables' init scale, and which linear layers have a bias."""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import compose_train, tiny_task
from flax import nnx

from attnlab.cli import ConfigError
from attnlab.config import head as build_head
from attnlab.config import normalizer as build_normalizer
from attnlab.config.assembly import assemble
from attnlab.model import Transformer

D, VOCAB, MAX_LEN = 64, 66, 512


def transformer(**options) -> Transformer:
    """A one-layer model on token inputs with learned positions, `options` over the shared defaults."""
    make = lambda **kw: build_normalizer("softmax", **kw)  # noqa: E731
    shared = dict(d_model=D, heads=1, layers=1, mlp_ratio=4, dropout=0.0, positional="learned", max_len=MAX_LEN)
    shared |= dict(causal=True, qk_norm=False, pooled=False, make_normalizer=make, seq_len=64, vocab_size=VOCAB)
    return Transformer(**shared | options, rngs=nnx.Rngs(0))


def params(module) -> dict:
    return nnx.to_pure_dict(nnx.state(module, nnx.Param))


def bias_paths(tree: dict, path=()) -> list[tuple]:
    """The paths of every `bias` leaf outside the norms (LayerNorm's shift is no linear layer's bias)."""
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += bias_paths(value, (*path, key))
        elif key == "bias" and not any(str(p).startswith("ln") for p in path):
            out.append((*path, key))
    return out


@pytest.mark.parametrize("std", [1.0, 0.3])
def test_embed_std_is_the_std_of_the_token_and_position_tables(std):
    p = params(transformer(embed_std=std))
    for table in (p["embed"]["embedding"], p["pos"]["embedding"]):  # 66·64 and 512·64 draws: ±3% of std
        assert abs(float(np.std(table)) / std - 1) < 0.03 and abs(float(np.mean(table))) < 0.03 * std


def test_without_embed_std_the_tables_keep_their_own_init():
    p = params(transformer())
    assert abs(float(np.std(p["embed"]["embedding"])) * D**0.5 - 1) < 0.05  # flax's variance scaling, fan-in d
    assert abs(float(np.std(p["pos"]["embedding"])) / 0.02 - 1) < 0.03


def test_bias_false_leaves_no_linear_layer_with_a_bias():
    assert bias_paths(params(transformer(bias=False))) == []
    assert bias_paths(params(transformer(bias=False, mlp="relu"))) == []
    head = build_head("softmax_ce", d_model=D, num_classes=64, rngs=nnx.Rngs(0), bias=False)
    assert params(head) == {"proj": {"kernel": params(head)["proj"]["kernel"]}}


@pytest.mark.parametrize(
    "mlp, bias, want",
    [("gelu", None, True), ("relu", None, True), ("swiglu", None, False), ("swiglu", True, True), ("gelu", True, True)],
)
def test_bias_null_is_the_mlp_kinds_own_and_true_gives_every_mlp_layer_one(mlp, bias, want):
    found = sorted(bias_paths(params(transformer(mlp=mlp, bias=bias))))
    assert found == ([("blocks", 0, "fc1", "bias"), ("blocks", 0, "fc2", "bias")] if want else [])


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.embed_std=0", "model.embed_std=0 is invalid; allowed: a finite number > 0.0"),
        ("model.bias=maybe", "model.bias='maybe' is invalid; allowed: true or false"),
        ("head.bias=1", "head.bias=1 is invalid; allowed: true or false"),
    ],
)
def test_a_bad_value_is_refused_naming_the_key(override, message):
    cfg = compose_train("model=tiny", "task=mqar", "head=softmax_ce", override, *tiny_task("mqar"))
    with pytest.raises(ConfigError, match=message):
        assemble(cfg, "softmax_ce")
