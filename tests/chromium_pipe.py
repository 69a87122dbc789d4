"""Headless Chromium driven through the DevTools protocol over --remote-debugging-pipe (no extra package).

Chromium reads NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
]

# Every leaf element's text, depth first through shadow roots (TensorBoard's Polymer tabs live in them).
DEEP_TEXT_JS = r"""(() => { const out = [];
  const walk = (n) => { if (n.shadowRoot) walk(n.shadowRoot);
    for (const c of n.children || []) walk(c);
    if (n.tagName && n.children.length === 0 && n.textContent.trim()) out.push([n.tagName, n.textContent.trim()]); };
  walk(document); return out; })()"""


class Chromium:
    """One headless browser with a fresh profile; `open(url)` gives a page session."""

    def __init__(self, width: int = 1400, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="attnlab-chromium-")
        to_chrome_r, self._out = os.pipe()
        self._in, from_chrome_w = os.pipe()

        def onto_fds_3_and_4():
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [
                shutil.which("chromium"),
                *FLAGS,
                f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            pass_fds=(3, 4),
            preexec_fn=onto_fds_3_and_4,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._id, self._buf = 0, b""

    def send(self, method: str, session: str | None = None, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._in, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def open(self, url: str) -> str:
        target = self.send("Target.createTarget", url=url)["targetId"]
        return self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def evaluate(self, session: str, expression: str):
        return self.send("Runtime.evaluate", session=session, expression=expression, returnByValue=True)["result"].get(
            "value"
        )

    def wait_for_text(self, session: str, needle: str, timeout: float = 60.0) -> list[list[str]]:
        """The deep leaf texts once one equals `needle` (the page's scripts load asynchronously)."""
        deadline = time.monotonic() + timeout
        while True:
            texts = self.evaluate(session, DEEP_TEXT_JS) or []
            if any(t == needle for _, t in texts) or time.monotonic() > deadline:
                return texts
            time.sleep(1.0)

    def screenshot(self, session: str, path, clip: tuple[int, int, int, int] | None = None) -> None:
        """A PNG of the page, or of the (x, y, width, height) pixels of it."""
        box = {} if clip is None else {"clip": dict(zip(("x", "y", "width", "height"), clip), scale=1)}
        data = self.send("Page.captureScreenshot", session=session, format="png", **box)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
