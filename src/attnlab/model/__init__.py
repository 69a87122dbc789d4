"""The model: the pre-LN transformer (transformer.py), its blocks (block.py: LayerNorm or RMSNorm, GELU or SwiGLU)
run under remat (remat.py), multi-head attention around a normalizer (attention.py), the hand-written backward
passes of its dense layers, GELU and embedding lookup (backward.py), the transformer with its head as the trained
module (net.py), and the gradient-norm group each parameter is tagged with where its module is built (groups.py).

It imports normalizers, never heads, config or tasks; heads import groups from here.
"""

from attnlab.model.attention import MultiHeadAttention
from attnlab.model.net import Net
from attnlab.model.transformer import Transformer

__all__ = ["MultiHeadAttention", "Net", "Transformer"]
