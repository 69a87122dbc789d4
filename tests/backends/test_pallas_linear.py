"""The fused Pallas kernels of causal linear attention equal its parallel (explicit matrix) form: output and
gradients w.r.t. q, k, v through each feature map, run in Pallas's interpret mode on the CPU; a float64 numpy
reference of the output and its gradients; the same kernels compiled for an H100."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_helpers import TINY, run_cli, tiny_task
from flax import nnx

from attnlab import config
from attnlab import normalizers as nz
from attnlab.backends import pallas_linear
from attnlab.checks import ConfigError
from attnlab.options.normalizers import FEATURE_MAPS

B, N, H = 2, 2, 8


def norm_of(feature_map="elu1", **opts):
    return config.normalizer(
        "linear", num_heads=N, head_dim=H, rngs=nnx.Rngs(0), feature_map=feature_map, num_features=16, **opts
    )


def qkv_ct(T, seed=0, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(seed), 4)
    return tuple(jax.random.normal(key, (B, N, T, H)).astype(dtype) for key in keys)


def fused_out(norm, mask):
    """Linear.__call__'s pallas branch on the CPU: its features and the kernels in interpret mode under its
    jax.checkpoint (Linear._pallas)."""
    return lambda q, k, v: norm._pallas(q, k, v, mask, interpret=True)


def out_and_grads(out, q, k, v, ct):
    """out(q, k, v) and the gradients of Σ out·ct w.r.t. q, k, v."""

    def loss(q, k, v):
        o = out(q, k, v)
        return jnp.sum(o.astype(jnp.float32) * ct), o

    (_, o), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)
    return o, grads


# (T, chunk, key lengths): T not a multiple of the chunk, T below one chunk, T a multiple; batch 1's last keys
# padding (Linear zeroes their φ(k)).
SCENARIOS = {"ragged": (23, 4, (23, 18)), "short": (5, 8, (5, 5)), "whole_chunks": (16, 4, (16, 11))}
# Every feature map on the ragged case, one on each other (each case compiles the interpreted kernels anew).
CASES = [("ragged", f) for f in FEATURE_MAPS] + [("short", "elu1"), ("whole_chunks", "relu")]


@pytest.mark.parametrize(("scenario", "feature_map"), CASES)
def test_kernels_equal_the_parallel_form(scenario, feature_map):
    """Output and the gradients w.r.t. q, k, v (through the feature map) against the explicit T×T form, float32."""
    T, chunk, lengths = SCENARIOS[scenario]
    valid = jnp.arange(T)[None] < jnp.array(lengths)[:, None]
    # Declared right padding goes to the kernels as key lengths (Linear._pallas); whole_chunks keeps a mask.
    mask = nz.Mask(causal=True, key_valid_BS=valid, right_padded=scenario != "whole_chunks")
    norm = norm_of(feature_map, impl="parallel", chunk_size=chunk)
    q, k, v, ct = qkv_ct(T)
    out, grads = out_and_grads(fused_out(norm, mask), q, k, v, ct)
    ref_out, ref_grads = out_and_grads(lambda q, k, v: norm(q, k, v, mask)[0], q, k, v, ct)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-6)
    for got, want, name in zip(grads, ref_grads, "qkv", strict=True):
        assert float(jnp.abs(want).max()) > 0, "a zero reference gradient would test nothing"
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"d{name}")
    padded = slice(lengths[1], None)
    assert not np.asarray(grads[1])[1, :, padded].any() and not np.asarray(grads[2])[1, :, padded].any()


@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_output_and_gradients_equal_a_float64_reference(eps):
    """out = num/(den + eps), num = A·v, den = A·1, A = tril(φ(q)φ(k)ᵀ); for L = Σ out·c: d num = c/d, d den =
    −Σₕ c·out/d (d = den + eps), dA = tril(d num·vᵀ + d den), dφ(q) = dA·φ(k), dφ(k) = dAᵀ·φ(q), dv = Aᵀ·d num, in
    float64 numpy; the kernels on float32, chunk 4, T = 13. Row 0 of batch 1 has φ(q) = 0: at eps = 0 its den is 0,
    its output and gradients 0."""
    T = 13
    keys = jax.random.split(jax.random.key(7), 4)
    qf, kf = (jax.random.uniform(key, (B, N, T, 16)) for key in keys[:2])  # positive, as features are
    qf = qf.at[1, :, 0].set(0.0)
    v, c = (jax.random.normal(key, (B, N, T, H)) for key in keys[2:4])

    def loss(qf, kf, v):
        out = pallas_linear.attention(qf, kf, v, 4, eps, interpret=True)
        return jnp.sum(out * c), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(qf, kf, v)
    q64, k64, v64, c64 = (np.asarray(x, np.float64) for x in (qf, kf, v, c))
    a = np.where(np.tril(np.ones((T, T), bool)), np.einsum("bntf,bnsf->bnts", q64, k64), 0.0)
    d = a.sum(-1, keepdims=True) + eps
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    want_out = (a @ v64) * inv
    dnum, dden = c64 * inv, -np.sum(c64 * want_out, -1, keepdims=True) * inv
    da = np.where(np.tril(np.ones((T, T), bool)), dnum @ v64.swapaxes(-1, -2) + dden, 0.0)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6 * np.abs(want_out).max())
    assert not np.asarray(out)[1, :, 0].any()
    want = (da @ k64, da.swapaxes(-1, -2) @ q64, a.swapaxes(-1, -2) @ dnum)
    for got, ref, name in zip(grads, want, ("φ(q)", "φ(k)", "v"), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max(), err_msg=f"d{name}")


def test_bfloat16_operands_track_the_float32_parallel_form():
    """bfloat16 φ(q), φ(k), v with float32 accumulation: output and gradients within bfloat16 rounding of the
    float32 parallel form on the same (rounded) inputs. Loose (3e-2 of each array's scale): the intra-chunk weights,
    the state and the numerator are rounded to bfloat16 (8 significant bits, 4e-3 each), as in
    Linear._chunked and fla, and the gradients are summed from such products over 37 rows."""
    T = 37
    mask = nz.Mask(causal=True)
    q, k, v = qkv_ct(T, seed=3, dtype=jnp.bfloat16)[:3]
    ct = qkv_ct(T, seed=4)[3]
    norm = norm_of(impl="parallel", chunk_size=8)
    out16, g16 = out_and_grads(fused_out(norm, mask), q, k, v, ct)
    f32 = tuple(x.astype(jnp.float32) for x in (q, k, v))
    out32, g32 = out_and_grads(lambda q, k, v: norm(q, k, v, mask)[0], *f32, ct)
    assert out16.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in g16)
    np.testing.assert_allclose(np.asarray(out16, np.float32), out32, atol=3e-2, rtol=3e-2)
    for got, want in zip(g16, g32, strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=3e-2 * float(jnp.abs(want).max()))


def test_vmapped_seeds_equal_per_seed_calls():
    """Under vmap (the trainer's vmapped seeds) the kernels give each seed its own output and gradients."""
    T, mask = 10, nz.Mask(causal=True)
    q, k, v, ct = qkv_ct(T, seed=2)
    seeds = jnp.stack([q, q[:, :, ::-1]]), jnp.stack([k, 2 * k]), jnp.stack([v, -v])
    out = fused_out(norm_of(impl="parallel", chunk_size=4), mask)

    def out_and_vjp(q, k, v):  # the output and the gradients of Σ out·ct
        o, pullback = jax.vjp(out, q, k, v)
        return o, pullback(ct)

    batched = jax.jit(jax.vmap(out_and_vjp))(*seeds)
    for s in range(2):
        alone = jax.jit(out_and_vjp)(*(x[s] for x in seeds))
        for got, want in zip(jax.tree.leaves(batched), jax.tree.leaves(alone), strict=True):
            np.testing.assert_allclose(got[s], want, rtol=1e-6, atol=1e-6)


def test_refuses_what_it_does_not_compute():
    causal, T = nz.Mask(causal=True, key_valid_BS=jnp.ones((B, 8), bool)), 8
    assert pallas_linear.input_problem(64, causal, T, T) is None
    for mask, S in (
        (nz.Mask(), T),
        (nz.Mask(causal=True, window=4), T),
        (nz.Mask(causal=True), T + 2),
        (nz.Mask(causal=True, dense_BTS=jnp.ones((B, T, T), bool)), T),
    ):
        assert pallas_linear.input_problem(64, mask, T, S).startswith("the kernels compute causal attention")
    assert "head dim 48" in pallas_linear.input_problem(48, causal, T, T)
    q, k, v, _ = qkv_ct(T)
    with pytest.raises(ValueError, match="feature dim 8"):  # Triton's limits, checked before lowering
        pallas_linear.attention(q, k, v, 4, 1e-6)
    with pytest.raises(ValueError, match="one shape"):
        pallas_linear.attention(q, k[..., :4], v, 4, 1e-6, interpret=True)
    with pytest.raises(ConfigError, match=r"^normalizer\.impl=pallas cannot run for linear: feature dim 24 "):
        config.normalizer(
            "linear", num_heads=N, head_dim=64, rngs=nnx.Rngs(0), feature_map="favor", num_features=24, impl="pallas"
        )


def test_cli_refuses_pallas_on_a_cpu_in_one_line(tmp_path):
    """As the pointwise kernels: asked for on a CPU, the run stops when the model is built, exit 2, one line."""
    overrides = ("normalizer=linear", "normalizer.impl=pallas", "model.d_model=32", "task=lm", *tiny_task("lm"))
    proc = run_cli(*TINY, *overrides, f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("attnlab: error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert lines == [
        "attnlab: error: normalizer.impl=pallas cannot run for linear: platform cpu (the kernels are compiled for gpu)"
    ]


@pytest.mark.gpu_program
@pytest.mark.parametrize(("T", "seeds"), [(1100, 1), (2048, 2)])
def test_kernels_compile_for_h100(T, seeds):
    """Forward and backward lower to two Triton kernels for an H100 (XLA compiles them, deviceless), T = 1100 a length
    whose padded size is no power of two, and vmapped over seeds; no T×T buffer, no loop left to XLA."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_program as gp

    def loss(qf, kf, v, ct):
        return jnp.sum(pallas_linear.attention(qf, kf, v, 64, 1e-6) * ct)

    with gp.on_target("h100") as mesh:
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        x = jax.ShapeDtypeStruct((seeds, 1, 2, T, 64), jnp.bfloat16, sharding=sharding)
        ct = jax.ShapeDtypeStruct((1, 2, T, 64), jnp.float32, sharding=sharding)
        # jax ≥ 0.12 reads the Triton target from the abstract mesh's device when no GPU is attached.
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            step = jax.vmap(jax.value_and_grad(loss, (0, 1, 2)), (0, 0, 0, None))
            compiled = jax.jit(step).trace(x, x, x, ct).lower().compile()
    program = gp.Program.of(compiled, T)
    assert program.custom_calls == {"__gpu$xla.gpu.triton": 2}
    assert program.txt_buffers == 0
    computations = gp.hlo_computations(compiled.as_text())[0].values()
    assert not [ins for comp in computations for ins in comp if ins.opcode == "while"]
