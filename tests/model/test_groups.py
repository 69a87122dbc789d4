"""Gradient-norm groups tagged at construction (attnlab.model.groups) against the old path-based rule."""

from __future__ import annotations

import functools
import itertools

import jax
import pytest
from cli_helpers import compose_train, tiny_task
from flax import nnx

from attnlab import config
from attnlab.config import normalizer as build_normalizer
from attnlab.config import registry
from attnlab.config.assembly import assemble
from attnlab.model import Net, Transformer
from attnlab.model.groups import GROUPS, leaf_groups, tag
from attnlab.normalizers import NormalizerParam


def path_groups_ref(params) -> tuple[list[str], list[int]]:
    """The path rule (steps.leaf_groups at commit b98f93a), the reference: groups from substrings of the path."""
    groups, layers = [], []
    flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
    for path, var in flat:
        names = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", None)))) for k in path]
        layers.append(int(names[names.index("blocks") + 1]) if "blocks" in names else -1)
        if isinstance(var, NormalizerParam):
            group = "normalizer"
        elif names[0] == "head":
            group = "head"
        elif "embed" in names or "pos" in names:
            group = "embedding"
        elif "attn" in names:
            group = "attention"
        elif any(n.startswith("ln") for n in names):
            group = "norm"
        else:
            group = "mlp"
        groups.append(("beta:" if "beta" in names else "") + group)
    return groups, layers


@pytest.mark.parametrize(
    "overrides",
    [
        (),  # the default experiment's model (model=small)
        (
            "model=tiny",
            "model.layers=2",
            "model.layer_normalizers=[softmax,linear]",
            "model.short_conv=3",
            "model.qk_norm=true",
        ),
        ("model=tiny", "normalizer=kl", "normalizer.prior=recency", "model.positional=rope"),
    ],
)
def test_tagged_groups_match_the_path_rule(overrides):
    cfg = compose_train("task=mqar", *overrides, *tiny_task("mqar"))
    _, nets, _, _ = assemble(cfg, "softmax_ce")
    _, params, _ = nnx.split(nets[0], nnx.Param, ...)
    groups, layers = leaf_groups(params)
    assert (groups, layers) == path_groups_ref(params)
    assert {g.removeprefix("beta:") for g in groups} >= {"embedding", "attention", "mlp", "norm", "head"}


def _net(normalizer: str, head: str, *, positional="learned", qk_norm=True, short_conv=3, tokens=True, **norm_opts):
    """An abstract (eval_shape) Net: no parameter is materialised."""

    def make():
        rngs = nnx.Rngs(0)
        body = Transformer(
            d_model=8,
            heads=2,
            layers=1,
            mlp_ratio=2,
            dropout=0.0,
            positional=positional,
            max_len=16,
            causal=True,
            qk_norm=qk_norm,
            pooled=False,
            seq_len=8,
            make_normalizer=functools.partial(build_normalizer, normalizer, **norm_opts),
            vocab_size=11 if tokens else None,
            input_dim=None if tokens else 3,
            short_conv=short_conv,
            rngs=rngs,
        )
        num_classes = 5 if config.head_kind(head) == "classification" else None
        return Net(body, config.head(head, d_model=8, num_classes=num_classes, rngs=rngs))

    return nnx.eval_shape(make)


def _assert_all_tagged(net):
    _, params, _ = nnx.split(net, nnx.Param, ...)
    groups, _ = leaf_groups(params)  # raises on an untagged parameter
    assert len(groups) == len(jax.tree.leaves(params)) and all(g.removeprefix("beta:") in GROUPS for g in groups)
    assert (groups, _) == path_groups_ref(params)


@pytest.mark.parametrize("normalizer", registry.choices("normalizer"))
def test_every_normalizer_and_head_tags_its_parameters(normalizer):
    for head in registry.choices("head"):
        _assert_all_tagged(_net(normalizer, head))


@pytest.mark.parametrize(
    "positional,qk_norm,short_conv,tokens",
    list(itertools.product(("learned", "sinusoidal", "rope", "none"), (False, True), (0, 2), (True, False))),
)
def test_every_model_option_tags_its_parameters(positional, qk_norm, short_conv, tokens):
    _assert_all_tagged(
        _net("softmax", "softmax_ce", positional=positional, qk_norm=qk_norm, short_conv=short_conv, tokens=tokens)
    )


@pytest.mark.parametrize("prior", ["recency", "learned"])
def test_kl_priors_are_tagged(prior):
    _assert_all_tagged(_net("kl", "softmax_ce", prior=prior))


class _Untagged(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jax.numpy.zeros(2))


def test_an_untagged_parameter_is_an_error():
    _, params, _ = nnx.split(_Untagged(), nnx.Param, ...)
    with pytest.raises(ValueError, match="w has no gradient group"):
        leaf_groups(params)


def test_an_unknown_group_is_refused_and_inner_declarations_win():
    with pytest.raises(ValueError, match="'mpl' is not one of"):
        tag("mpl", _Untagged())
    m = _Untagged()
    tag("attention", m)
    tag("mlp", m)  # an outer module does not override what the inner one tagged
    assert leaf_groups(nnx.split(m, nnx.Param, ...)[1])[0] == ["attention"]


def test_the_qk_norm_gain_is_an_attention_parameter_not_decayed_like_layernorm_scales():
    from attnlab.optim import decay_mask

    cfg = compose_train("task=mqar", "model=tiny", "model.qk_norm=true", *tiny_task("mqar"))
    _, params, _ = nnx.split(assemble(cfg, "softmax_ce")[1][0], nnx.Param, ...)
    flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
    names = [".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path) for path, _ in flat]
    groups, _ = leaf_groups(params)
    decayed = jax.tree.leaves(decay_mask(params))
    by_name = dict(zip(names, zip(groups, decayed, (v for _, v in flat))))
    gain = next(n for n in names if n.endswith("qk_gain"))
    ln_scale = next(n for n in names if n.endswith("ln1.scale"))
    assert by_name[gain][0] == "attention" and not isinstance(by_name[gain][2], NormalizerParam)
    assert by_name[gain][1] is False and by_name[ln_scale][1] is False  # as LayerNorm scales: no weight decay
