"""The GPU program of the train steps, compiled for an H100 without a GPU (scripts/gpu_program.py).

Needs the CUDA plugin of the installed jax: `make test-gpu-program` builds that environment and runs
`pytest -m gpu_program`. The structure tests use model=base cut to 2 layers at B=2, T=1024 (statistics on
sampled rows, two key blocks): the full-size program's structure at a compile cost 2 cores can
pay. The ratio targets hold at a size, not in general (the statistics program's share grows with B and
the layers), so they are tested at two fixed sizes, model=base at B=32, T=1024 and (the plain step
against the reference) at B=4, T=8192; the rest of the B=4, T=8192 figures are the script's table in
BENCHMARKS.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import gpu_program as gp  # noqa: E402
import normalizer_refs as R  # noqa: E402

from attnlab import config
from attnlab.backends import impl, sampled_rows
from attnlab.config import registry  # noqa: E402

pytestmark = pytest.mark.gpu_program

B, T, LAYERS = 2, 1024, 2
EXTRA = (f"model.layers={LAYERS}",)
FULL = (32, T)  # (B, T) of model=base with all 8 layers
LONG = (4, 8192)
HEADS, HEAD_DIM = 8, 64  # model=base


def capability(name: str, **options) -> impl.Capability:
    """What normalizer `name` with these options can run besides its dense form (backends/impl.py)."""
    return config.normalizer(name, num_heads=HEADS, head_dim=HEAD_DIM, **options).capability()


def fused_variants() -> dict[str, tuple[str, ...]]:
    """{normalizer: its overrides}: the first option variant (normalizer_refs.cases) of each registered normalizer
    that cuDNN flash attention computes (softmax with its defaults; kl with its uniform prior, its default recency
    prior being a bias)."""
    fused = {}
    for name, _, options in R.cases():
        if name not in fused and capability(name, **options).fused:
            fused[name] = tuple(f"normalizer.{key}={value}" for key, value in options.items())
    return fused


FUSED_EXTRA = fused_variants()
FUSED = list(FUSED_EXTRA)


@pytest.fixture(scope="module")
def mesh():
    with gp.on_target("h100") as m:
        yield m


@pytest.fixture(scope="module")
def programs(mesh):
    """(name, seeds, extra overrides, full size) -> {"plain", "stats": Program, "impl"}, compiled once per
    module; name "reference" is the hand-written step, "reference with its math" that step with attnlab's β and
    gradient clipping. `full`: None for the 2-layer cut at (B, T), else model=base's (batch, length)."""
    cache = {}

    def get(key: str, seeds: int = 1, extra: tuple = (), full: tuple | None = None):
        if (key, seeds, extra, full) not in cache:
            (batch, length), base = (full, ()) if full else ((B, T), EXTRA)
            overrides = gp.run_overrides(
                "base", batch, length, "softmax" if key.startswith("reference") else key, seeds, base + extra
            )
            if key.startswith("reference"):
                compiled = gp.reference_program(mesh, batch, length, overrides, same_math=key != "reference")
                cache[key, seeds, extra, full] = {"plain": gp.Program.of(compiled, length)}
            else:
                p = gp.attnlab_programs(mesh, overrides)
                cache[key, seeds, extra, full] = {
                    "plain": gp.Program.of(p["plain"], length),
                    "stats": gp.Program.of(p["stats"], length),
                    "impl": p["impl"],
                }
        return cache[key, seeds, extra, full]

    return get


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


@pytest.mark.parametrize("size", [FULL, LONG], ids=["B32_T1024", "B4_T8192"])
def test_plain_softmax_step_stays_within_its_measured_ratios_to_the_reference(programs, size):
    """The plain step against the hand-written one: kernels, bytes and peak ≤ 1.1× (measured 1.08×, 0.91×, 0.81×
    at both sizes, BENCHMARKS.md; the reference clips no gradient and has no β); and the per-kind kernel difference
    (gpu_program --diff-kernels) accounts for every extra kernel."""
    ref, plain = programs("reference", full=size)["plain"], programs("softmax", full=size)["plain"]
    ratios = {"kernels": plain.kernels / ref.kernels, "bytes": plain.gbytes / ref.gbytes, "peak": plain.peak / ref.peak}
    assert ratios["bytes"] <= 1.1 and ratios["peak"] <= 1.1 and ratios["kernels"] <= 1.1, ratios
    extra = sum(int(line.split()[0]) for line in gp.kernel_diff(plain, ref))
    assert extra == plain.kernels - ref.kernels and not gp.kernel_diff(plain, plain)


def test_plain_softmax_step_against_the_reference_with_its_math(programs):
    """Given attnlab's learned β and global-norm clip, the hand-written step launches 539 kernels (461 without);
    the plain softmax step, with its finiteness check and skip and the gradient norms it returns, 0.93× as many
    (BENCHMARKS.md), and moves and holds less: bound at 1× kernels, bytes and peak."""
    ref, plain = programs("reference with its math", full=FULL)["plain"], programs("softmax", full=FULL)["plain"]
    assert ref.kernels > programs("reference", full=FULL)["plain"].kernels
    ratios = {"kernels": plain.kernels / ref.kernels, "bytes": plain.gbytes / ref.gbytes, "peak": plain.peak / ref.peak}
    assert ratios["kernels"] <= 1.0 and ratios["bytes"] <= 1.0 and ratios["peak"] <= 1.0, ratios


def test_logging_softmax_step_stays_within_its_measured_ratios_to_the_plain_step(programs):
    """The logging step (statistics program + plain step) within 1.75× the plain step's kernels and bytes (measured
    1.70× and 1.70× with the extreme-token statistics, 1.67× and 1.67× with the sink statistics alone, 1.43× and
    1.49× without; BENCHMARKS.md): the sampled-row statistics read the scores without writing the weights, and one
    median serves every layer's value drain and residual peak."""
    p = programs("softmax", full=FULL)
    logging = p["stats"] + p["plain"]
    ratios = {"kernels": logging.kernels / p["plain"].kernels, "bytes": logging.gbytes / p["plain"].gbytes}
    assert ratios["kernels"] <= 1.75 and ratios["bytes"] <= 1.75, ratios


def test_the_embedding_gradient_is_scatter_added_in_float32_where_the_reference_adds_bfloat16(programs):
    """The lm embedding's (257×512) gradient: one scatter, in float32 (backward.take_rows), where autodiff's bfloat16
    lookup, as the hand-written step has it, scatters in bfloat16. On the H100 target the bfloat16 scatter compiles
    to four scalar system-scope bfloat16 atomics per thread and the float32 one to one 4-wide float32 atomic
    (`bench_embedding_grad.py --ptx h100`); on the H100 the bfloat16 one took 58-63 ms of a 65-74 ms step."""

    def scatters(program):
        return {kind.split()[-1] for kind in program.kinds if ":scatter " in kind and kind.endswith("[257,512]")}

    assert scatters(programs("softmax")["plain"]) == {"f32[257,512]"}
    assert scatters(programs("reference", full=FULL)["plain"]) == {"bf16[257,512]"}


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


H100_BYTES = 80 * 2**30  # the H100 SXM's memory


PAPER_VOCAB = 32768  # lm_normalizers/screen_paper's task.bpe_vocab_size


@pytest.fixture(scope="module")
def paper_tokenizer(tmp_path_factory) -> str:
    """A tokenizer.json of PAPER_VOCAB ids: the shipped corpus's BPE (which stops near 9,200 ids) with unused tokens
    added up to the preset's vocabulary, so the embedding and the logits have the shapes the preset gives them."""
    from attnlab.tasks.lm import corpus, subwords

    docs, _ = corpus.pydoc_topics()
    hf = subwords.Tokenizer.from_str(subwords.trained_bpe(docs, PAPER_VOCAB).hf.to_str())
    hf.add_tokens([f"<unused_{i}>" for i in range(PAPER_VOCAB - hf.get_vocab_size())])
    path = tmp_path_factory.mktemp("paper") / "tokenizer.json"
    hf.save(str(path))
    return str(path)


@pytest.mark.parametrize(
    "model, seeds, more",
    [("llama_60m", 1, ("model.extreme_token_stats=true",)), ("llama_125m", 1, ()), ("llama_125m", 2, ())],
)
def test_the_paper_size_models_compile_for_the_h100_within_its_memory_at_t2048_in_bfloat16(
    mesh, paper_tokenizer, model, seeds, more
):
    """The paper presets' models at their batch (32 windows of 2048 tokens of a 32,768-id vocabulary, task.bos,
    bfloat16; lm_normalizers/screen_paper's llama_125m, vmapped seeds or not, and attention_sinks/lm_bos_paper's
    llama_60m with its residual statistics): the plain and the logging step compile for the H100, the plain one on
    cuDNN flash attention, each within the device's memory by XLA's peak."""
    extra = ("task.bos=true", f"task.tokenizer={paper_tokenizer}", *more)
    overrides = gp.run_overrides(model, 32 // seeds, 2048, "softmax", seeds, extra)
    programs = gp.attnlab_programs(mesh, overrides)
    for kind in ("plain", "stats"):
        p = gp.Program.of(programs[kind], 2048)
        assert p.peak is not None and p.peak < H100_BYTES, (kind, p.peak / 2**30)
    plain = gp.Program.of(programs["plain"], 2048)  # (SwiGLU's width is 2048 at 125M: T×T-shaped, no score buffer)
    assert plain.custom_calls["__cudnn$fmhaSoftmaxBackward"] > 0 and {flash for flash, _ in plain.fmha} == {True}
