"""Rotary position embedding against its complex-number definition in float64 (Su et al. 2021, RoFormer eq. 34)."""

import jax.numpy as jnp
import numpy as np
import pytest

from attnlab.model.attention import rope


def rope_reference(x_BNTH, positions_T, base=10000.0):
    """Each pair (x_i, x_{i+H/2}) as x_i + i·x_{i+H/2}, times e^{i·t·θ_i}, θ_i = base^(−i/(H/2)); float64."""
    H = x_BNTH.shape[-1]
    F = H // 2
    theta_F = base ** (-np.arange(F, dtype=np.float64) / F)
    z = x_BNTH[..., :F].astype(np.float64) + 1j * x_BNTH[..., F : 2 * F].astype(np.float64)
    z = z * np.exp(1j * positions_T.astype(np.float64)[:, None] * theta_F[None])
    return np.concatenate([z.real, z.imag, x_BNTH[..., 2 * F :].astype(np.float64)], -1)


@pytest.mark.parametrize("H", [8, 64, 7])
def test_rope_rotates_each_pair_by_its_position_times_its_frequency(H):
    x_BNTH = np.random.default_rng(H).standard_normal((2, 3, 6, H)).astype(np.float32)
    positions_T = np.array([0, 1, 2, 17, 255, 8191])
    got = np.asarray(rope(jnp.asarray(x_BNTH), jnp.asarray(positions_T)))
    want = rope_reference(x_BNTH, positions_T)
    # float32 angles: t·θ at t = 8191 is off by up to ~8191·2⁻²⁴ rad; near t = 0 only by rounding
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)
    np.testing.assert_allclose(got[..., :3, :], want[..., :3, :], atol=1e-6, rtol=0)


def test_rope_scores_depend_on_the_offset_only():
    """⟨rope(q, m), rope(k, n)⟩ = ⟨rope(q, m + s), rope(k, n + s)⟩: attention scores see relative position."""
    rng = np.random.default_rng(0)
    q, k = (jnp.asarray(rng.standard_normal((1, 2, 1, 16)), jnp.float32) for _ in range(2))
    scores = [
        float(jnp.sum(rope(q, jnp.array([m + s])) * rope(k, jnp.array([n + s]))))
        for m, n, s in [(5, 2, 0), (5, 2, 40), (5, 2, 300)]
    ]
    np.testing.assert_allclose(scores[1:], [scores[0]] * 2, rtol=1e-4)


def test_rope_keeps_bfloat16():
    x = jnp.ones((1, 1, 4, 8), jnp.bfloat16)
    assert rope(x, jnp.arange(4)).dtype == jnp.bfloat16
