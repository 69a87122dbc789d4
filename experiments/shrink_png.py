"""Shrink report PNGs for committing: quantise to an adaptive 256-colour palette and re-save optimised, in place.

Usage: python experiments/shrink_png.py FILE.png [FILE.png ...]
"""

import sys

from PIL import Image

for path in sys.argv[1:]:
    im = Image.open(path).convert("RGB")
    im.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
