"""The GPU program's structure, compiled for an H100 without a GPU at the 2-layer cut (tests/gpu_programs.py): which
backend each normalizer runs, no T×T buffer where it keeps none, cuDNN flash attention, the Pallas kernels.

Needs the CUDA plugin of the installed jax: `make test-gpu-program` builds that environment and runs
`pytest -m gpu_program`.
"""

from __future__ import annotations

import jax
import pytest
from gpu_programs import EXTRA, FULL, FUSED, FUSED_EXTRA, LAYERS, B, T, capability, gp

from attnlab.backends import impl, sampled_rows
from attnlab.config import registry

pytestmark = pytest.mark.gpu_program


def test_kernel_count_multiplies_a_loop_body_by_its_trip_count(mesh):
    """Kernels grow by the body's kernels per extra iteration: 3 more trips add 3× what 1 more adds."""
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    x = jax.ShapeDtypeStruct((64, 64), jax.numpy.float32, sharding=sharding)

    def kernels(n):
        def f(x):
            body = lambda i, y: jax.numpy.sort(y @ y, axis=0) + jax.numpy.cumsum(y, axis=1)  # noqa: E731
            return jax.lax.fori_loop(0, n, body, x)

        return gp.Program.of(jax.jit(f).lower(x).compile(), 64).kernels

    k3, k4, k6 = kernels(3), kernels(4), kernels(6)
    assert k4 > k3 and k6 - k3 == 3 * (k4 - k3)


def test_a_dense_softmax_shows_its_txt_buffers(programs):
    """The detector's positive control: impl=dense materialises B×N×T×T scores."""
    plain = programs("softmax", extra=("normalizer.impl=dense",))["plain"]
    assert plain.txt_buffers > 0 and plain.txt_largest >= B * 8 * T * T * 2


@pytest.mark.parametrize("name", FUSED)
def test_softmax_and_kl_run_cudnn_flash_attention_forward_and_backward(programs, name):
    p = programs(name, extra=FUSED_EXTRA[name])
    assert p["impl"] == ["cudnn"]
    calls = p["plain"].custom_calls
    assert calls["__cudnn$fmhaSoftmax"] == LAYERS and calls["__cudnn$fmhaSoftmaxBackward"] == LAYERS
    assert p["plain"].fmha == {(True, "PADDING_CAUSAL")}  # flash, key lengths + causal: no mask or bias tensor


@pytest.mark.parametrize("name", registry.choices("normalizer"))
def test_no_txt_buffer_where_the_backend_keeps_none(programs, name):
    """No plain or logging step materialises a T×T array where its backend keeps none: cuDNN (softmax, kl with its
    uniform prior aside, auto), linear's chunked form (auto) and, asked for (within the H100's memory budget auto
    keeps these scores dense), the blockwise form of every other normalizer; entmax, with no form but the dense one
    (its threshold τ needs every score of a row), says so."""
    assert sampled_rows.at_length(T, T)
    can = capability(name)  # with its defaults, as the run below builds it
    auto = "cudnn" if can.fused else "chunked" if can.linear_chunk else None  # what auto takes that keeps no scores
    expected = auto or ("blockwise" if can.blockwise else "dense")
    p = programs(name, extra=("normalizer.impl=blockwise",) if expected == "blockwise" else ())
    assert p["impl"] == [expected]
    takes_layer_input = registry.resolve_target(
        registry.load("normalizer", name)["_target_"], "normalizer"
    ).takes_layer_input
    if expected == "dense":
        assert p["plain"].txt_buffers > 0
    elif takes_layer_input:  # forgetting: its gates have no sampled-row form, so its logging step runs dense
        assert p["plain"].txt_buffers == 0 and p["stats"].txt_buffers > 0, p["impl"]
    else:
        assert (p["plain"].txt_buffers, p["stats"].txt_buffers) == (0, 0), p["impl"]


def test_auto_keeps_the_sigmoid_scores_dense_within_the_budget_and_goes_blockwise_beyond(programs):
    """impl=auto on the H100 target (deviceless: the default GPU budget): B=2 at T=1024 keeps 2·8·1024²·8 bytes ·
    2 layers = 256 MiB of dense scores, within the 10 GiB budget, so dense and T×T buffers; all 8 layers at B=32
    keep 16 GiB, beyond it, so blockwise."""
    assert impl.dense_score_bytes(impl.Workload(B, 8, LAYERS), T, T) == 2**28 <= impl.memory_budget("gpu")
    assert impl.dense_score_bytes(impl.Workload(FULL[0], 8, 8), T, T) == 16 * 2**30 > impl.memory_budget("gpu")
    p = programs("sigmoid")
    assert p["impl"] == ["dense"] and p["plain"].txt_buffers > 0


@pytest.mark.parametrize("name", FUSED)
def test_vmapped_seeds_compile_for_the_gpu(programs, name):
    """trainer.vmap_seeds=2 with cuDNN attention compiles (the studies vmap their seeds), still on cuDNN."""
    p = programs(name, seeds=2, extra=FUSED_EXTRA[name])
    assert p["plain"].custom_calls["__cudnn$fmhaSoftmaxBackward"] >= LAYERS and p["plain"].txt_buffers == 0


def test_on_the_h100_the_float32_embedding_scatter_issues_a_quarter_of_the_bfloat16_ones_atomics():
    """The PTX of the embedding gradient's forms (bench_embedding_grad.py --ptx): per thread, four scalar bfloat16
    atomics for autodiff's bfloat16 scatter, one 4-wide float32 atomic for take_rows', none for the one-hot matmul."""
    import bench_embedding_grad

    found = bench_embedding_grad.ptx_atomics("h100", tokens=4096, dim=512, vocab=257)
    bf16, f32 = found["scatter bf16"], found["take_rows f32"]
    assert sum(bf16.values()) == 4 and all(op.endswith(".bf16") for op in bf16)
    assert sum(f32.values()) == 1 and all(".v4.f32" in op for op in f32)
    assert not found["one-hot matmul"]


def test_the_a100_target_compiles_softmax_on_cudnn_flash_attention():
    """The second target (Ampere, compute capability 8.0): head dim 64 is within cuDNN's pre-Hopper limit."""
    assert gp.compute_capability(gp.target_config("a100")) == (8, 0)
    with gp.on_target("a100") as a100:
        p = gp.attnlab_programs(a100, gp.run_overrides("base", B, T, "softmax", 1, EXTRA))
    plain = gp.Program.of(p["plain"], T)
    assert p["impl"] == ["cudnn"] and plain.fmha == {(True, "PADDING_CAUSAL")} and plain.txt_buffers == 0


def test_pallas_linear_step_moves_and_holds_no_more_than_the_chunked_form(programs, mesh):
    """linear at impl=pallas: its two fused kernels per layer (backends/pallas_linear.py), no T×T buffer in the plain
    or logging step, and the plain step's bytes accessed and peak ≤ the chunked form's (at B=4 T=8192 with all 8 layers,
    BENCHMARKS.md: also ≤ cuDNN softmax's, 0.97× its bytes and its peak less 1 KB, too thin a margin to assert)."""
    chunked = programs("linear", extra=("normalizer.impl=chunked",))
    # jax ≥ 0.12 reads the kernels' Triton target from the abstract mesh's device when no GPU is attached.
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        fused = programs("linear", extra=("normalizer.impl=pallas",))
    assert (chunked["impl"], fused["impl"]) == (["chunked"], ["pallas"])
    assert fused["plain"].custom_calls["__gpu$xla.gpu.triton"] == 2 * LAYERS
    assert (fused["plain"].txt_buffers, fused["stats"].txt_buffers) == (0, 0)
    assert fused["plain"].gbytes <= chunked["plain"].gbytes and fused["plain"].peak <= chunked["plain"].peak


@pytest.mark.parametrize("name", ["sigmoid", "relu"])
def test_pallas_pointwise_steps_keep_no_txt_buffer_in_the_plain_or_logging_step(programs, mesh, name):
    """sigmoid and ReLU at impl=pallas: three fused kernels per layer in the plain step, and the logging step's
    statistics on sampled rows, as blockwise, not from a dense T×T form (at B=4 T=8192, all 8 layers, the dense
    statistics asked an H100 for 96 GiB)."""
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        p = programs(name, extra=("normalizer.impl=pallas",))
    assert p["impl"] == ["pallas"]
    assert p["plain"].custom_calls["__gpu$xla.gpu.triton"] == 3 * LAYERS
    assert (p["plain"].txt_buffers, p["stats"].txt_buffers) == (0, 0)
