"""README screenshots of TensorBoard on a sweep, taken in headless Chromium (Debian package `chromium`).

Usage: python experiments/tb_screenshots.py SWEEP_DIR OUT_DIR
Writes OUT_DIR/tb_hparams.png, tb_custom_scalars.png, tb_timeseries.png, tb_attn_map.png (then shrink them
with experiments/shrink_png.py).
"""

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from chromium_pipe import Chromium  # noqa: E402

# regex:[_,]normalizer=([^,/]+), URL-encoded: the colour groups of the URL a sweep prints (run.summary.color_group)
COLOUR = "runColorGroup=regex:%5B_%2C%5Dnormalizer%3D(%5B%5E%2C%2F%5D%2B)"
VIEWS = {  # name: (URL query and fragment, text to wait for, seconds to settle, viewport, clip x, y, w, h)
    "tb_hparams": (f"?{COLOUR}#hparams", "Trial ID", 3, (1700, 480), None),
    "tb_custom_scalars": (f"?{COLOUR}#custom_scalars&_smoothingWeight=0", "layer 0", 6, (1200, 1400), None),
    "tb_timeseries": (f"?smoothing=0&{COLOUR}#timeseries", "Time Series", 8, (1900, 1150), (0, 64, 1900, 1086)),
    "tb_attn_map": (
        f"?smoothing=0&{COLOUR}&tagFilter=attn_map/layer_0/#timeseries",
        "Time Series",
        8,
        (1600, 760),
        (335, 170, 1000, 420),
    ),
}


def main(sweep_dir: str, out_dir: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    board = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", sweep_dir, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    browser = None
    try:
        for _ in range(60):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugins_listing", timeout=5)
                break
            except OSError:
                time.sleep(1)
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        for name, (suffix, needle, settle, (w, h), clip) in VIEWS.items():
            browser = Chromium(width=w, height=h)
            page = browser.open(f"http://127.0.0.1:{port}/{suffix}")
            browser.wait_for_text(page, needle)
            time.sleep(settle)
            browser.screenshot(page, Path(out_dir) / f"{name}.png", clip)
            browser.close()
            browser = None
            print(Path(out_dir) / f"{name}.png")
    finally:
        if browser is not None:
            browser.close()
        board.kill()
        board.wait()


if __name__ == "__main__":
    main(*sys.argv[1:3])
