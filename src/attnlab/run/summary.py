"""A single run's printed summary: what ran, its headline metric against the task's baselines, each test metric,
where the time went and, for an interrupted run, the command that resumes it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import quote

from attnlab.run import convergence
from attnlab.run.chance import describe
from attnlab.run.record import read_json


def run_json(record: dict[str, Any]) -> dict[str, Any]:
    try:
        return read_json(Path(record["run_dir"]) / "run.json")
    except (OSError, ValueError, KeyError):
        return {}


def what_ran(record: dict[str, Any], run: dict[str, Any]) -> str:
    """`ran: normalizer=softmax task=mqar head=softmax_ce model=tiny steps=800/800 device=cpu×1`."""
    choices, config, env = run.get("choices", {}), run.get("config", {}), run.get("env", {})
    parts = [f"{g}={choices[g]}" for g in ("normalizer", "task", "head", "model") if choices.get(g)]
    layers = config.get("model", {}).get("layer_normalizers")
    if layers:
        parts.append(f"layer_normalizers=[{','.join(layers)}]")
    total = config.get("trainer", {}).get("steps")
    parts.append(f"steps={record.get('steps')}" + (f"/{total}" if total else ""))
    if env.get("backend"):
        parts.append(f"device={env['backend']}×{len(env.get('devices', []))}")
    return "ran: " + " ".join(parts)


def headline(record: dict[str, Any]) -> str | None:
    """`headline: test/accuracy 0.842 (baselines: chance 0.0312)`: the metric the task judges a run by
    (metrics.json's `headline`, Task.judged_by) beside its baselines."""
    final, base, key = record.get("final", {}), record.get("baseline", {}), record.get("headline")
    if key not in final:
        return None
    refs = record.get("baseline_labels", {}).get(key, {})
    against = ", ".join(f"{label} {base[k]:.4g}" for k, label in refs.items() if k in base)
    return f"headline: {key} {final[key]:.4g}" + (f" (baselines: {against})" if against else "")


def passes_over_text(record: dict[str, Any], run: dict[str, Any]) -> str | None:
    """`16.5 passes over the training text (99,130 tokens)` where a language-model run predicted more tokens than
    its training text holds (run.json's corpus.train_tokens; steps × batch × task.seq_len per seed), else None.
    Language-model pretraining, the setting the attention papers measure, sees its text less than once; a run that
    repeats it can fit it, and its held-out loss then rises while its training loss falls."""
    tokens = (run.get("corpus") or {}).get("train_tokens")
    config = run.get("config", {})
    batch, seq_len = config.get("trainer", {}).get("batch_size"), config.get("task", {}).get("seq_len")
    steps = record.get("steps")
    if not all(isinstance(v, int) and v > 0 for v in (tokens, batch, seq_len, steps)):
        return None
    passes = steps * batch * seq_len / tokens
    return f"{passes:.3g} passes over the training text ({tokens:,} tokens)" if passes > 1 else None


def smaller_lr(run: dict[str, Any]) -> str:
    """What to try after a divergence: a learning rate ten times smaller than the run's (run.json's config)."""
    lr = run.get("config", {}).get("optim", {}).get("lr")
    if not isinstance(lr, (int, float)):
        return "try a smaller optim.lr"
    return f"try a smaller learning rate, e.g. optim.lr={lr / 10:.3g} (this run: optim.lr={lr:.3g})"


def resume_command(record: dict[str, Any], run: dict[str, Any]) -> str:
    """The command that continues an interrupted run from its checkpoint (the run's own overrides kept)."""
    run_dir = Path(record["run_dir"])
    if run.get("config", {}).get("trainer", {}).get("vmap_seeds", 1) > 1:
        run_dir = run_dir.parent  # seed<k>/ of a vmapped run: the checkpoint is the parent's
    keep = [o for o in run.get("overrides", []) if not o.startswith(("hydra.run.dir=", "trainer.resume="))]
    return shlex.join(["attnlab-train", *keep, "trainer.resume=true", f"hydra.run.dir={run_dir}"])


def opening_lines(record: dict[str, Any]) -> list[str]:
    """What ran and the headline first; the resume command when the run was interrupted."""
    run = run_json(record)
    lines = [what_ran(record, run)]
    top = headline(record)
    if top:
        lines.append(top)
    unsettled = convergence.describe(record)
    if unsettled:  # its numbers say where training stopped, not what the configuration can do
        lines.append(f"warning: {unsettled}")
    repeated = passes_over_text(record, run)
    if repeated:
        lines.append(f"warning: {repeated}")
    if record.get("status") == "interrupted":
        lines.append(f"resume: {resume_command(record, run)}")
    return lines


def throughput_words(record: dict[str, Any]) -> str:
    """ "N tokens/s, MFU x% (P parameters)", MFU n/a where no device peak is known (run.throughput)."""
    mfu = record.get("mfu")
    params = record.get("params", {}).get("total", 0)
    return (
        f"{record.get('tokens_per_sec', 0):,.0f} tokens/s, MFU {'n/a' if mfu is None else f'{100 * mfu:.1f}%'}, "
        f"{params:,} parameters"
    )


def print_summary(record: dict[str, Any]) -> None:
    """The summary a single run prints on stdout when it ends."""
    print("\n".join(opening_lines(record)))
    final, base = record.get("final", {}), record.get("baseline", {})
    print(
        f"run: {record['run_dir']}  status: {record['status']}  steps: {record.get('steps')}  "
        f"({record.get('steps_per_sec', 0):.1f} steps/s, {throughput_words(record)}, "
        f"compile {record.get('compile_time_s', 0):.1f}s)"
    )
    if record.get("diverged"):
        print(
            f"  diverged at step {record['diverged']['step']}: {record['diverged']['reason']}; "
            f"{smaller_lr(run_json(record))}"
        )
    for key in sorted(k for k in final if k.startswith("test/")):
        b = base.get("baseline/" + key.split("/", 1)[1])
        flag = record.get("chance", {}).get(key, {})
        print(
            f"  {key:24s} {final[key]:.4f}"
            + ("" if b is None else f"   (baseline {b:.4f})")
            + (f"  {describe(flag)}" if describe(flag) else "")
        )
    timing = record.get("timing") or {}
    if timing:  # where the wall time went (train.PHASES); steps/s above counts the train loop alone
        parts = ", ".join(f"{k} {v:.1f}" for k, v in timing.items() if k != "total")
        print(f"time (s): {timing['total']:.1f} total = {parts}")
    print("\n".join(tensorboard_lines(str(record["run_dir"]), prefix="curves: ")))


TENSORBOARD_URL = "http://127.0.0.1:6006/"  # TensorBoard's default port; it prints the one it took
# Smoothing off: a val curve has a handful of points, and the default 0.6 never reaches the last values.
SMOOTHING_OFF = "?smoothing=0"
# Custom Scalars (a legacy dashboard) keeps its own smoothing slider in the URL fragment, default 0.6. It colours
# runs from its palette in run order: TensorBoard 2.21's tf_color_scale ignores runColorGroup.
CUSTOM_SCALARS = "#custom_scalars&_smoothingWeight=0"


def color_regex(keys: list[str]) -> str:
    """A regex whose capture groups are the values of `keys` in a sweep's job name (`3_normalizer=kl,seed=1`): a
    key starts the name or follows a comma; several keys are lookaheads, so their order in the name does not matter.
    TensorBoard groups runs by the captured values (JSON of the groups) and gives each group one colour."""
    parts = [f"[_,]{re.escape(k)}=([^,/]+)" for k in keys]
    return parts[0] if len(parts) == 1 else "".join(f"(?=.*{p})" for p in parts)


def color_group(keys: list[str]) -> str:
    """`&runColorGroup=regex:...` colouring runs by `keys` (color_regex), URL-encoded: a bare "+" in a query reads
    as a space."""
    if not keys:
        return ""
    return "&runColorGroup=" + quote(f"regex:{color_regex(keys)}", safe=":()*")


def tensorboard_lines(logdir: str, color_by: list[str] = (), prefix: str = "") -> list[str]:
    """The TensorBoard command for `logdir`, the URL that opens Time Series unsmoothed and coloured by `color_by` keys,
    and the one that opens Custom Scalars unsmoothed."""
    url = TENSORBOARD_URL + SMOOTHING_OFF + color_group(list(color_by)) + "#timeseries"
    indent = " " * len(prefix)
    return [
        f"{prefix}tensorboard --logdir {shlex.quote(logdir)} --host 127.0.0.1",
        f"{indent}then open {url}",
        f"{indent}Custom Scalars, unsmoothed: {TENSORBOARD_URL}{CUSTOM_SCALARS}",
    ]
