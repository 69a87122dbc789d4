"""The fused Pallas kernels of sigmoid and ReLU attention equal the dense form: outputs and gradients
(q, k, v, β), run in Pallas's interpret mode on the CPU; the same kernels compiled for an H100."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.backends import pallas_sigmoid

CASES = {
    "sigmoid": ("sigmoid", {}),
    "sigmoid_bias": ("sigmoid", {"bias": -1.5}),
    "relu": ("relu", {}),
}


def padding(S, first_valid, last_valid):
    """key_valid (2, S): batch row b keeps keys first_valid[b] <= s < last_valid[b]."""
    s = jnp.arange(S)[None, :]
    return (s >= jnp.array(first_valid)[:, None]) & (s < jnp.array(last_valid)[:, None])


# (T, S, mask, block_size): T and S not multiples of the tile, T ≠ S, padding at either end (batch 0's
# first 5 keys are padding: its causal rows 0 and 1 have no admissible key), windows both ways.
SCENARIOS = {
    "unmasked": (9, 9, lambda: nz.Mask(), 4),
    "causal_padded_T_ne_S": (10, 13, lambda: nz.Mask(causal=True, key_valid_BS=padding(13, [5, 0], [13, 10])), 4),
    "causal_window": (11, 11, lambda: nz.Mask(causal=True, window=3, key_valid_BS=padding(11, [0, 0], [11, 9])), 4),
    "bidirectional_window": (13, 13, lambda: nz.Mask(window=4, key_valid_BS=padding(13, [0, 2], [13, 13])), 8),
}


def qkv_ct(T, S, B=2, N=2, H=8, seed=0):
    keys = jax.random.split(jax.random.key(seed), 4)
    return tuple(jax.random.normal(k, (B, N, L, H)) for k, L in zip(keys, (T, S, S, T), strict=True))


def out_and_grads(norm, attend, q, k, v, ct):
    """The output and the gradients of Σ out·ct for (β, q, k, v), `attend(norm, q, k, v)` computing out."""
    graphdef, params, rest = nnx.split(norm, nz.NormalizerParam, ...)

    def loss(params, q, k, v):
        out = attend(nnx.merge(graphdef, params, rest), q, k, v)
        return jnp.sum(out * ct), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True))(params, q, k, v)
    return out, grads


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("case", list(CASES))
def test_kernels_equal_dense_form(case, scenario):
    """Output and every gradient, with each mask pattern the kernels take, against the dense form."""
    name, opts = CASES[case]
    T, S, make_mask, block = SCENARIOS[scenario]
    mask = make_mask()
    norm = config.normalizer(name, num_heads=2, head_dim=8, impl="dense", beta=0.9, **opts)
    norm.beta.theta[...] = norm.beta.theta[...] + jnp.array([0.3, -0.2])  # two heads, two β: a per-head bug shows
    q, k, v, ct = qkv_ct(T, S)

    def fused(n, q, k, v):
        return pallas_sigmoid.attention(n.block_form(), q, k, v, mask, block, interpret=True)

    out, grads = out_and_grads(norm, fused, q, k, v, ct)
    ref_out, ref_grads = out_and_grads(norm, lambda n, q, k, v: n.dense_call(q, k, v, mask), q, k, v, ct)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-6)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        assert float(jnp.abs(want).max()) > 0, "a zero reference gradient would test nothing"
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_bfloat16_operands_match_dense_form():
    """bfloat16 q, k, v (float32 scores and accumulation, as the blockwise form): within bfloat16's rounding."""
    norm = config.normalizer("sigmoid", num_heads=2, head_dim=8, impl="dense")
    mask = nz.Mask(causal=True)
    q, k, v, _ = (x.astype(jnp.bfloat16) for x in qkv_ct(12, 12, seed=1))
    fused = jax.jit(lambda q, k, v: pallas_sigmoid.attention(norm.block_form(), q, k, v, mask, 4, interpret=True))(
        q, k, v
    )
    dense = norm.dense_call(q, k, v, mask)
    assert fused.dtype == jnp.bfloat16
    np.testing.assert_allclose(fused.astype(np.float32), dense.astype(np.float32), rtol=2e-2, atol=2e-2)


def test_refuses_what_it_does_not_compute():
    norm = config.normalizer("sigmoid", num_heads=2, head_dim=8, impl="dense")
    relu = config.normalizer("relu", num_heads=2, head_dim=8, impl="dense")
    window = nz.Mask(causal=True, window=4, key_valid_BS=jnp.ones((2, 6), bool))
    assert pallas_sigmoid.problem(norm.block_form(), 64, window) is None
    assert pallas_sigmoid.problem(relu.block_form(), 128, window) is None
    q, k, v, _ = qkv_ct(6, 6)
    with pytest.raises(ValueError, match="explicit"):
        dense = nz.Mask(dense_BTS=jnp.ones((2, 6, 6), bool))
        pallas_sigmoid.attention(norm.block_form(), q, k, v, dense, 4, interpret=True)
    softmax = config.normalizer("softmax", num_heads=2, head_dim=8, impl="dense")
    with pytest.raises(ValueError, match="pointwise forms only"):
        pallas_sigmoid.attention(softmax.block_form(), q, k, v, nz.Mask(), 4)
    with pytest.raises(ValueError, match="one head dim"):
        pallas_sigmoid.attention(norm.block_form(), q, k, v[..., :4], nz.Mask(), 4)
    with pytest.raises(ValueError, match="head dim 8"):  # Triton's limits, checked before lowering
        pallas_sigmoid.attention(norm.block_form(), q, k, v, nz.Mask(), 4)


def test_vmapped_seeds_equal_per_seed_calls():
    """Under vmap (the trainer's vmapped seeds) the kernels give each seed's own output gradients."""
    norm = config.normalizer("sigmoid", num_heads=2, head_dim=8, impl="dense")
    mask = nz.Mask(causal=True)
    q, k, v, ct = qkv_ct(10, 10, seed=2)
    seeds = jnp.stack([q, q[:, :, ::-1]]), jnp.stack([k, 2 * k]), jnp.stack([v, -v])

    def grads(q, k, v):
        out = lambda q, k, v: pallas_sigmoid.attention(norm.block_form(), q, k, v, mask, 4, interpret=True)  # noqa: E731
        return jax.grad(lambda q, k, v: jnp.sum(out(q, k, v) * ct), (0, 1, 2))(q, k, v)

    batched = jax.jit(jax.vmap(grads))(*seeds)
    for s in range(2):
        for got, want in zip(batched, jax.jit(grads)(*(x[s] for x in seeds)), strict=True):
            np.testing.assert_allclose(got[s], want, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu_program
@pytest.mark.parametrize(("T", "seeds"), [(1100, 1), (2048, 1), (1024, 2)])
def test_kernels_compile_for_h100(T, seeds):
    """Forward and backward lower to three Triton kernels for an H100 (XLA compiles them, deviceless), T = 1100
    a length whose padded size is no power of two, and vmapped over seeds; no T×T buffer, no loop left to
    XLA. (No Mosaic GPU: it lowers no dot_general.)"""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_program as gp

    B, N, H = 1, 2, 64
    norm = config.normalizer("sigmoid", num_heads=N, head_dim=H, impl="blockwise")
    mask = nz.Mask(causal=True, key_valid_BS=jnp.ones((B, T), bool))

    def loss(q, k, v, ct):
        out = pallas_sigmoid.attention(norm.block_form(), q, k, v, mask, 64)
        return jnp.sum(out.astype(jnp.float32) * ct)

    with gp.on_target("h100") as mesh:
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        x = jax.ShapeDtypeStruct((seeds, B, N, T, H), jnp.bfloat16, sharding=sharding)
        ct = jax.ShapeDtypeStruct((B, N, T, H), jnp.float32, sharding=sharding)
        # jax ≥ 0.12 reads the Triton target from the abstract mesh's device when no GPU is attached.
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            step = jax.vmap(jax.value_and_grad(loss, (0, 1, 2)), (0, 0, 0, None))
            compiled = jax.jit(step).trace(x, x, x, ct).lower().compile()
    program = gp.Program.of(compiled, T)
    assert program.custom_calls == {"__gpu$xla.gpu.triton": 3}
    assert program.txt_buffers == 0
    computations = gp.hlo_computations(compiled.as_text())[0].values()
    assert not [ins for comp in computations for ins in comp if ins.opcode == "while"]
