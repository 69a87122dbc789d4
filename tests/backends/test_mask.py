"""attend / attention_weights take jax.nn's mask convention: boolean (B,N,T,S) or broadcastable, (B,T,S)
and Mask; any other shape is refused with a message naming the accepted ones."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import normalizer_refs as R
import numpy as np
import pytest

from attnlab import config
from attnlab import normalizers as nz
from attnlab.config import registry

pytestmark = pytest.mark.numerics  # `make test-numerics` runs these on whatever accelerator JAX sees

B, N, T, S, H = R.B, R.N, 5, 7, R.H
# Every shape jax.nn.dot_product_attention broadcasts, plus our (B,T,S).
SHAPES = [(B, N, T, S), (1, 1, T, S), (B, 1, T, S), (1, N, T, S), (B, T, S), (1, T, S)]


def random_mask(shape, seed=3):
    """A random boolean mask whose every row (after broadcasting) keeps at least one key."""
    m = np.random.default_rng(seed).random(shape) < 0.5
    m[..., 0] = True
    return m


def per_head_BNTS(m):
    """The mask broadcast to (B,N,T,S), jax.nn's form."""
    return np.broadcast_to(m if m.ndim == 4 else m[:, None], (B, N, T, S))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_softmax_with_any_accepted_mask_equals_dot_product_attention(shape):
    q, k, v = R.qkv(11, T, S)
    m = random_mask(shape)
    out, _ = config.attend("softmax", q, k, v, mask=m, learnable=False, with_stats=False)
    m4 = m if m.ndim == 4 else m[:, None]
    want = jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(m4), implementation="xla")  # scale 1/√H
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-5, rtol=1e-4)


# Every registered normalizer but those that need causal attention (these masks are bidirectional).
@pytest.mark.parametrize("name", [n for n in registry.choices("normalizer") if n not in R.CAUSAL_ONLY])
@pytest.mark.parametrize("shape", [(B, N, T, S), (1, N, T, S), (B, 1, T, S)], ids=str)
def test_per_head_mask_matches_the_float64_reference_head_by_head(name, shape):
    """Head n under a (B,N,T,S) mask equals the numpy reference under that head's (B,T,S) slice."""
    q, k, v = R.qkv(5, T, S)
    m_BNTS = per_head_BNTS(random_mask(shape))
    w = np.asarray(config.attention_weights(name, q, k, mask=random_mask(shape)))
    out, _ = config.attend(name, q, k, v, mask=random_mask(shape), with_stats=True)
    norm = R.build(name, {})
    for n in range(N):
        w_ref_BNTS = R.reference(norm, q, k, m_BNTS[:, n])[0]
        w_ref = w_ref_BNTS[:, n]
        np.testing.assert_allclose(w[:, n], w_ref, atol=2e-5, rtol=1e-4, err_msg=f"head {n}")
        out_ref = R.output(norm, w_ref_BNTS, np.swapaxes(v, 1, 2))[:, n]  # w·v, or its own (differential)
        np.testing.assert_allclose(np.asarray(out)[:, :, n], out_ref, atol=2e-5, rtol=1e-4, err_msg=f"head {n}")
    assert (w[~m_BNTS] == 0).all()


def test_mask_object_still_accepted_and_combined_with_causal():
    q, k, v = R.qkv(2, T, T)
    valid = np.ones((B, T), bool)
    valid[1, 3:] = False
    w = np.asarray(
        config.attention_weights("softmax", q, k, mask=nz.Mask(key_valid_BS=jnp.asarray(valid)), causal=True)
    )
    m_BTS = R.admissible(B, T, T, valid, None, causal=True)
    w_ref = R.reference(R.build("softmax", {}), q, k, m_BTS)[0]
    np.testing.assert_allclose(w, w_ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", [(B, N + 1, T, S), (T, S), (B, T, S + 1), (B, 1, 1, T, S), (3, T, S)], ids=str)
def test_other_mask_shapes_are_refused_naming_the_accepted_ones(shape):
    q, k, v = R.qkv(1, T, S)
    for call in (
        lambda m: config.attend("softmax", q, k, v, mask=m),
        lambda m: config.attention_weights("kl", q, k, mask=m),
    ):
        with pytest.raises(ValueError) as info:
            call(np.ones(shape, bool))
        msg = str(info.value)
        assert "\n" not in msg and str(tuple(shape)) in msg, msg
        assert "(B, T, S)" in msg and "(B, N, T, S)" in msg and f"{(B, N, T, S)}" in msg, msg
