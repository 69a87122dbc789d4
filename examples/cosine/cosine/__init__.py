"""A user's normalizer for attnlab through the general contract: cosine attention with a learnable temperature."""

from cosine.attention import CosineAttention

__all__ = ["CosineAttention"]
