"""Tokens per second, model FLOPs per token and MFU (run.throughput): the PaLM count by hand, a run's records."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from cli_helpers import compose_train, tiny_task
from flax import nnx

from attnlab.config.assembly import assemble
from attnlab.run.throughput import Throughput, parameter_counts, peak_tflops


@pytest.mark.parametrize(
    "kind, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("TPU v5 lite", 197.0),
        ("TPU v5p", 459.0),
        ("cpu", None),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
def test_peak_of_a_device_kind_and_none_where_unknown(kind, peak):
    assert peak_tflops(kind) == peak


def tiny_net(positional):
    cfg = compose_train("model=tiny", f"model.positional={positional}", *tiny_task("lm"))
    _, nets, _, _ = assemble(cfg, "softmax_ce")
    return cfg, nets[0]


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_non_embedding_parameters_leave_out_the_lookup_tables_counted_by_hand(positional):
    cfg, net = tiny_net(positional)
    D, L, F, V = (
        cfg.model.d_model,
        cfg.model.layers,
        cfg.model.mlp_ratio * cfg.model.d_model,
        net.body.embed.num_embeddings,
    )
    # per block: qkv (D·3D, no bias), out (D·D), two LayerNorms (2·2D), the MLP (D·F + F + F·D + D); the final LayerNorm
    block = 3 * D * D + D * D + 4 * D + D * F + F + F * D + D
    head = sum(x.size for x in jax.tree.leaves(nnx.state(net.head, nnx.Param)))
    # a normalizer's own parameters (β per head for softmax)
    extra = sum(x.size for b in net.body.blocks for x in jax.tree.leaves(nnx.state(b.attn.normalizer, nnx.Param)))
    tables = V * D + (cfg.model.max_len * D if positional == "learned" else 0)
    want_non_embedding = L * block + 2 * D + head + extra
    assert parameter_counts(net) == {"non_embedding": want_non_embedding, "total": want_non_embedding + tables}


def test_palm_flops_per_token_and_mfu_by_hand():
    cfg, net = tiny_net("rope")
    N = parameter_counts(net)["non_embedding"]
    L, D = cfg.model.layers, cfg.model.d_model

    class H100:
        device_kind = "NVIDIA H100 80GB HBM3"

    got = Throughput.of(net, batch_size=8, seq_len=32, seeds=3, devices=[H100(), H100()])
    assert got.tokens_per_step == 8 * 32 * 3 and got.flops_per_token == 6 * N + 12 * L * 32 * D
    rates = got.rates(10.0)
    assert rates["tokens_per_sec"] == 10.0 * 8 * 32 * 3
    np.testing.assert_allclose(rates["mfu"], rates["tokens_per_sec"] * got.flops_per_token / (2 * 989e12))
