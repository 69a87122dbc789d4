"""attnlab: ablate the attention normalizer of transformers."""

__version__ = "0.1.0"
