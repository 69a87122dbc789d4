"""The normalizer contract is enforced, not hoped for: every normalizer class under attnlab.normalizers
has a YAML whose keys are its constructor's options, and half-implemented ones are refused."""

import types

import pytest

from attnlab import config
from attnlab import normalizers as nz
from attnlab.checks import ConfigError
from attnlab.config import construct, registry
from attnlab.normalizers import contract


def _concrete_classes():
    todo, out = [nz.Normalizer], []
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls not in (nz.Normalizer, nz.ScoreNormalizer) and cls.__module__.startswith("attnlab."):
            out.append(cls)
    return out


def _configs():
    return {
        n: (
            registry.resolve_target(registry.load("normalizer", n)["_target_"], "normalizer"),
            registry.load("normalizer", n),
        )
        for n in registry.choices("normalizer")
    }


def test_every_normalizer_class_has_a_matching_yaml():
    configs = _configs()  # resolving each `_target_` first imports a module that only its YAML names
    classes = _concrete_classes()
    assert {c.__name__ for c in classes} >= {"Softmax", "KL", "Linear", "Entmax", "Squared", "ReLU"}
    for cls in classes:
        construct.check_configured("normalizer", cls, configs, deferred=contract.FROM_ATTENTION)
    assert {target for target, _ in configs.values()} <= set(classes)  # every YAML builds a contract class


def _score_without_normalize():
    class NoNormalize(nz.ScoreNormalizer):
        def __init__(self, *, num_heads, head_dim, rngs):
            pass


def _positional_without_rows():
    class PositionalPrior(nz.ScoreNormalizer):
        def normalize(self, z_BNTS, m_B1TS, q_pos_T=None):
            return z_BNTS, z_BNTS, {}


def _without_call():
    class NoCall(nz.Normalizer):
        def weights(self, q_BNTH, k_BNSH, mask):
            return None


def _without_weights():
    class NoWeights(nz.Normalizer):
        def __call__(self, q_BNTH, k_BNSH, v_BNSH, mask, *, with_stats=False):
            return v_BNSH, {}


def _layer_index_without_setter():
    class ByDepth(nz.Softmax):
        takes_layer_index = True


@pytest.mark.parametrize(
    "define,member",
    [
        (_score_without_normalize, "does not implement normalize "),
        (_layer_index_without_setter, "does not implement set_layer_index"),
        (_positional_without_rows, "does not implement normalize_rows"),
        (_without_call, "does not implement __call__"),
        (_without_weights, "does not implement weights"),
    ],
)
def test_half_implemented_normalizer_is_refused_at_definition(define, member):
    with pytest.raises(TypeError, match=member):
        define()


def test_complete_subclasses_are_accepted():
    class Positional(nz.KL):  # inherits KL's normalize_rows with its positional normalize
        pass

    class Tempered(nz.Softmax):
        def normalize(self, z_BNTS, m_B1TS):
            return super().normalize(2 * z_BNTS, m_B1TS)

    assert Positional.normalize_rows is nz.KL.normalize_rows and Tempered.weights is nz.Softmax.weights


class _Scaled(nz.Softmax):
    """A complete normalizer with one option more than softmax's YAML has."""

    def __init__(self, *, num_heads, head_dim, rngs, scale=2.0, **softmax_options):
        super().__init__(num_heads=num_heads, head_dim=head_dim, rngs=rngs, **softmax_options)
        self.scale = scale


def test_yaml_and_constructor_must_agree():
    configs = _configs()
    with pytest.raises(ConfigError, match="normalizer _Scaled .*scale.* has no YAML"):
        construct.check_configured("normalizer", _Scaled, configs, deferred=contract.FROM_ATTENTION)
    softmax = registry.load("normalizer", "softmax")
    refusal = r"^unknown key\(s\) normalizer\.bogus for normalizer=fake.*; allowed: adaptive_temp"
    with pytest.raises(ConfigError, match=refusal):
        construct.check_configured(
            "normalizer",
            nz.Softmax,
            deferred=contract.FROM_ATTENTION,
            configs={"fake": (nz.Softmax, {**softmax, "bogus": 1})},
        )
    without_block = {k: v for k, v in softmax.items() if k != "block_size"}
    with pytest.raises(ConfigError, match="takes block_size but normalizer/fake.yaml has no such key"):
        construct.check_configured(
            "normalizer", nz.Softmax, deferred=contract.FROM_ATTENTION, configs={"fake": (nz.Softmax, without_block)}
        )


def test_construction_refuses_an_option_the_config_lacks():
    node = {k: v for k, v in registry.load("normalizer", "kl").items() if k != "slope"}
    with pytest.raises(ConfigError, match="KL.__init__ takes slope"):
        construct.build("normalizer", node, deferred=contract.FROM_ATTENTION)
    made = construct.build("normalizer", registry.load("normalizer", "kl"), deferred=contract.FROM_ATTENTION)(
        num_heads=2, head_dim=4, rngs=None
    )
    assert isinstance(made, nz.KL) and made.prior == "recency"


class _NoScores(nz.Normalizer):
    """A complete normalizer with no score matrix to probe (softmax inside, hidden)."""

    def __init__(self, *, num_heads, head_dim, rngs):
        self.inner = nz.Softmax(num_heads=num_heads, head_dim=head_dim, rngs=rngs)

    def __call__(self, q_BNTH, k_BNSH, v_BNSH, mask, *, with_stats=False):
        return self.inner(q_BNTH, k_BNSH, v_BNSH, mask, with_stats=with_stats)

    def weights(self, q_BNTH, k_BNSH, mask):
        return self.inner.weights(q_BNTH, k_BNSH, mask)


@pytest.mark.parametrize("second,layers,said", [("softmax", [0, 1], False), ("none", [0], True)])
def test_score_grad_availability_is_said_per_layer(capsys, second, layers, said):
    from flax import nnx

    from attnlab.model import Transformer
    from attnlab.run.files import compute_record

    makers = [
        lambda **kw: config.normalizer("softmax", **kw),
        (lambda **kw: config.normalizer("softmax", **kw)) if second == "softmax" else _NoScores,
    ]
    model = Transformer(
        d_model=8,
        heads=2,
        layers=2,
        mlp_ratio=2,
        dropout=0.0,
        positional="learned",
        max_len=6,
        causal=True,
        qk_norm=False,
        pooled=False,
        seq_len=6,
        vocab_size=5,
        make_normalizer=makers,
        rngs=nnx.Rngs(0),
    )
    record = compute_record(types.SimpleNamespace(body=model), 6, "highest")
    err = capsys.readouterr().err
    assert record["score_grad_layers"] == layers
    assert ("score_grad not logged for layer(s) 1 (_NoScores)" in err) == said
