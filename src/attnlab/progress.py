"""Progress reporting: a tqdm bar on a terminal, plain periodic lines otherwise, nothing when quiet;
the run's phases timed and announced; a sweep job's lines labelled with its name."""

from __future__ import annotations

import contextlib
import datetime
import functools
import sys
import time
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

MODES = ("auto", "bar", "lines", "none")


class Progress:
    """Advance with `update(step, n, loss)`; loss is shown when known (on logging steps)."""

    def __init__(self, mode: str, total: int, start: int):
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode, self.bar = mode, None
        self.total, self.start, self.t0 = total, start, time.perf_counter()
        if mode == "bar":
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


class Phases:
    """Wall seconds per named phase of a run; a phase nested in another is not counted in the outer one.

    `with phases("name", "what is being computed"):` also prints the message on stderr when the phase
    starts and its duration when it ends (trainer.progress=none: silent), so no minute after the last step
    passes without a line.
    """

    def __init__(self, mode: str = "lines"):
        self.seconds: dict[str, float] = {}
        self.say = mode != "none"
        self._inner: list[float] = []  # per open phase: seconds spent in phases nested in it

    def note(self, message: str) -> None:
        """A line on stderr (unless quiet) for something that takes no time worth measuring."""
        if self.say:
            print(message, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def __call__(self, name: str, message: str | None = None):
        if message and self.say:
            print(f"{message} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed - self._inner.pop()
            if self._inner:
                self._inner[-1] += elapsed
            if message and self.say:
                print(f"{message}: {elapsed:.1f}s", file=sys.stderr, flush=True)


class Labelled:
    """A text stream that starts every line written to it with `[label] ` (a sweep's job name), so that the lines
    of jobs running side by side (hydra/launcher=joblib) say whose they are."""

    def __init__(self, stream, label: str):
        self.stream, self.prefix, self.partial = stream, f"[{label}] ", ""

    def write(self, text: str) -> int:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        if lines:
            self.stream.write("".join(f"{self.prefix}{line}\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def close_line(self) -> None:
        """Write an unfinished last line."""
        if self.partial:
            self.stream.write(f"{self.prefix}{self.partial}\n")
            self.partial = ""
        self.stream.flush()

    def close(self) -> None:
        """Write an unfinished last line and leave the stream underneath open: it is the process's. A logging handler
        made inside the job holds this stream, and closes it when the next job's Hydra reconfigures logging (absl's
        PythonHandler closes any stream that is not sys.stderr itself and no terminal)."""
        self.close_line()

    def isatty(self) -> bool:
        return False  # never a bar: one bar per job would overwrite the others' lines

    def __getattr__(self, name):
        return getattr(self.stream, name)


@contextlib.contextmanager
def labelled(label: str):
    """stdout and stderr of this process labelled with `label` (Labelled) until the block ends."""
    out, err = Labelled(sys.stdout, label), Labelled(sys.stderr, label)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        out.close_line()
        err.close_line()


def job_mode(mode: str) -> str:
    """A sweep job's progress mode: plain lines (a bar per job would fight over the terminal); none stays none."""
    return "none" if mode == "none" else "lines"


def in_sweep_labelled(run: Callable) -> Callable:
    """Decorates the train entry point: inside a Hydra multirun, the job's output is labelled with its directory's
    name (`[3_normalizer=kl,seed=1] step 100: loss ...`)."""

    @functools.wraps(run)
    def wrapped(cfg, *args, **kwargs):
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return run(cfg, *args, **kwargs)
        with labelled(Path(hc.runtime.output_dir).name):
            return run(cfg, *args, **kwargs)

    return wrapped
