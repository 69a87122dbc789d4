"""Progress reporting: a tqdm bar on a terminal, plain periodic lines otherwise, nothing when quiet."""

from __future__ import annotations

import datetime
import sys
import time

MODES = ("auto", "bar", "lines", "none")


class Progress:
    """Advance with `update(step, n, loss)`; loss is shown when known (on logging steps)."""

    def __init__(self, mode: str, total: int, start: int):
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode, self.bar = mode, None
        self.total, self.start, self.t0 = total, start, time.perf_counter()
        if mode == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=start, dynamic_ncols=True, desc="train")

    def update(self, step: int, n: int, loss: float | None):
        if self.bar is not None:
            self.bar.update(n)
            if loss is not None:
                self.bar.set_postfix_str(f"loss {loss:.4f}")
        elif self.mode == "lines" and loss is not None:
            print(f"step {step}: loss {loss:.4f}  ({step}/{self.total}, {self.left(step)} left)", flush=True)

    def left(self, step: int) -> str:
        """Time left at the mean rate of this process's steps so far (compilation excluded: it came before)."""
        done = step - self.start
        if done <= 0:
            return "?"
        seconds = (time.perf_counter() - self.t0) / done * (self.total - step)
        return str(datetime.timedelta(seconds=round(seconds)))

    def close(self):
        if self.bar is not None:
            self.bar.close()
