"""check_task: the `Task` contract (attnlab.tasks.base) run on one task."""

from __future__ import annotations

import math

import numpy as np

from attnlab.checks import ConfigError
from attnlab.tasks.base import SPLITS

from .violation import ContractViolation, fail

SEED, OTHER_SEED = 3, 4
BASELINE_KEYS = {"classification": {"accuracy"}, "regression": {"mse", "mse_zero"}}


def check_task(make, *, name: str) -> None:
    """Run the `Task` contract on the tasks `make(**overrides)` builds; raise ContractViolation naming the first broken
    property, the split and the seed.

    `make` builds the task with its options updated by the overrides the checker passes: `seed`, and for a task with a
    length option (`length_option`) that option, and `n_train` / `n_val` where the task has them. Properties, in the
    order they are checked:

    - description: `kind` is classification | regression, `granularity` token | sequence; exactly one of
      `vocab_size` / `input_dim` is set; `num_classes` is set exactly for classification; `default_head` names a
      head; the splits are train, val, test in that order.
    - split arrays, per split: inputs int32 (n,T) token ids in [0, vocab_size) or float32 (n,T,input_dim), T =
      `seq_len`, padding 0; `valid` bool (n,T) with a valid token in every row; targets (n,T) for token tasks, (n,)
      for sequence tasks, int32 classes in [0, num_classes) or float32; `weights` float32 of the targets' shape, each 0
      or 1, some 1, 0 on padding (token tasks); targets under weight 0 are 0.
    - disjoint splits: no input row is in two splits.
    - determinism by seed: the same seed gives identical arrays, another seed other inputs in every split.
    - baselines, per split: `baseline(split)` holds the contract's keys (accuracy; mse and mse_zero), each a finite
      float ≥ 0; `baseline_labels` names only baseline keys, under the `headline_metric` among others; the values of
      `plateaus()` are finite floats.
    - test lengths, where the task declares `length_option`: rebuilt at its own length L and at a longer one (the first
      of 2L, 2L + 1, L + 1, L + 2 it accepts), the test split is the same with train and val shrunk to one example
      (tasks.lengths rebuilds it so); at L it is the task's test split; the longer length gives longer sequences; the
      rebuilt test split meets the split contract.
    """
    subject = f"task={name}"
    task = _build(subject, make, "construction", seed=SEED)
    _description(subject, task)
    for split, s in task.splits.items():
        _split_arrays(subject, task, split, s, f"seed={SEED} split={split}")
    _disjoint(subject, task)
    again, other = (
        _build(subject, make, "determinism", seed=SEED),
        _build(subject, make, "determinism", seed=OTHER_SEED),
    )
    for split in SPLITS:
        for field in ("inputs", "targets", "weights", "valid"):
            if not np.array_equal(getattr(task.splits[split], field), getattr(again.splits[split], field)):
                raise fail(subject, "determinism by seed", f"{split} {field} differ between two builds", f"seed={SEED}")
        if np.array_equal(task.splits[split].inputs, other.splits[split].inputs):
            raise fail(subject, "determinism by seed", f"{split} inputs equal at seeds {SEED} and {OTHER_SEED}", "")
    _baselines(subject, task)
    if getattr(type(task), "length_option", None) is not None:
        _test_lengths(subject, make, task)


def _build(subject, make, prop, **overrides):
    try:
        return make(**overrides)
    except ContractViolation:
        raise
    except Exception as exc:  # noqa: BLE001 — any crash of the task is a violation of `prop`
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        where = " ".join(f"{k}={v}" for k, v in overrides.items())
        raise fail(subject, prop, f"raised {type(exc).__name__}: {first}", where) from exc


def _description(subject, task):
    problems = []
    if task.kind not in ("classification", "regression"):
        problems.append(f"kind={task.kind!r}, allowed: classification | regression")
    if task.granularity not in ("token", "sequence"):
        problems.append(f"granularity={task.granularity!r}, allowed: token | sequence")
    if (task.vocab_size is None) == (task.input_dim is None):
        problems.append(f"vocab_size={task.vocab_size} and input_dim={task.input_dim}: exactly one must be set")
    if (task.num_classes is not None) != (task.kind == "classification"):
        problems.append(f"num_classes={task.num_classes} for a {task.kind} task")
    if not (isinstance(task.default_head, str) and task.default_head):
        problems.append(f"default_head={task.default_head!r} names no head")
    if list(task.splits) != list(SPLITS):
        problems.append(f"splits {list(task.splits)}, expected {list(SPLITS)}")
    if problems:
        raise fail(subject, "description", problems[0], f"seed={SEED}")


def _split_arrays(subject, task, split, s, where):  # noqa: C901 — one check per line of the Split contract
    def bad(what):
        return fail(subject, "split arrays", what, where)

    n, t = s.inputs.shape[:2]
    if t != task.seq_len:
        raise bad(f"inputs have {t} positions, seq_len is {task.seq_len}")
    if task.vocab_size is not None:
        if s.inputs.dtype != np.int32 or s.inputs.ndim != 2:
            raise bad(f"token inputs are {s.inputs.dtype} {s.inputs.shape}, expected int32 (n, T)")
        if s.inputs.size and (s.inputs.min() < 0 or s.inputs.max() >= task.vocab_size):
            raise bad(f"token ids span [{s.inputs.min()}, {s.inputs.max()}], outside [0, {task.vocab_size})")
    elif s.inputs.dtype != np.float32 or s.inputs.shape != (n, t, task.input_dim):
        raise bad(f"inputs are {s.inputs.dtype} {s.inputs.shape}, expected float32 (n, T, {task.input_dim})")
    if s.valid.dtype != np.bool_ or s.valid.shape != (n, t):
        raise bad(f"valid is {s.valid.dtype} {s.valid.shape}, expected bool (n, T)")
    if (s.inputs[~s.valid] != 0).any():
        raise bad("padding (valid False) holds nonzero inputs")
    if not s.valid.any(axis=1).all():
        raise bad("a row has no valid token")
    shape = (n, t) if task.granularity == "token" else (n,)
    if s.targets.shape != shape or s.weights.shape != shape or s.weights.dtype != np.float32:
        raise bad(f"targets {s.targets.shape}, weights {s.weights.dtype} {s.weights.shape}; expected {shape} float32")
    if not set(np.unique(s.weights)) <= {0.0, 1.0} or not s.weights.sum() > 0:
        raise bad("weights must be 0 or 1, and not all 0")
    if task.granularity == "token" and (s.weights[~s.valid] != 0).any():
        raise bad("a padding position has weight 1")
    if task.kind == "classification":
        if s.targets.dtype != np.int32 or s.targets.min() < 0 or s.targets.max() >= task.num_classes:
            raise bad(f"targets {s.targets.dtype} in [{s.targets.min()}, {s.targets.max()}], expected int32 classes")
    elif s.targets.dtype != np.float32:
        raise bad(f"regression targets are {s.targets.dtype}, expected float32")
    if (s.targets[s.weights == 0] != 0).any():
        raise bad("targets under weight 0 must be 0 (placeholders, not information)")


def _disjoint(subject, task):
    rows = {split: {r.tobytes() for r in s.inputs} for split, s in task.splits.items()}
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1 :]:
            shared = len(rows[a] & rows[b])
            if shared:
                raise fail(subject, "disjoint splits", f"{shared} input rows in both {a} and {b}", f"seed={SEED}")


def _baselines(subject, task):
    keys = BASELINE_KEYS.get(task.kind, set())
    for split in SPLITS:
        where = f"seed={SEED} split={split}"
        try:
            base = task.baseline(split)
        except Exception as exc:  # noqa: BLE001
            raise fail(subject, "baselines", f"baseline raised {type(exc).__name__}: {exc}", where) from exc
        if not keys <= set(base):
            raise fail(subject, "baselines", f"keys {sorted(base)} lack {sorted(keys - set(base))}", where)
        for key, value in base.items():
            if not (isinstance(value, float) and math.isfinite(value) and value >= 0):
                raise fail(subject, "baselines", f"{key}={value!r} is not a finite float >= 0", where)
        labels = task.baseline_labels
        if task.headline_metric not in labels:
            raise fail(subject, "baselines", f"the headline {task.headline_metric} has no baseline_labels", where)
        unknown = {k for refs in labels.values() for k in refs} - set(base)
        if unknown:
            raise fail(subject, "baselines", f"baseline_labels name {sorted(unknown)}, not keys of baseline()", where)
    plateaus = task.plateaus() if hasattr(task, "plateaus") else {}
    for metric, values in plateaus.items():
        if not all(isinstance(v, float) and math.isfinite(v) for v in values.values()):
            raise fail(
                subject, "baselines", f"plateaus()[{metric!r}] = {values} holds a non-finite value", f"seed={SEED}"
            )


def _longer(make, task, length):
    """The first of 2L, 2L + 1, L + 1, L + 2 at which the task builds (it may refuse some lengths in one line)."""
    for at in (2 * length, 2 * length + 1, length + 1, length + 2):
        try:
            make(seed=SEED, **task.length_options([at])[at])
        except ConfigError:
            continue
        return at
    return None


def _test_lengths(subject, make, task):
    option = type(task).length_option
    length = int(task.options[option])
    longer = _longer(make, task, length)
    if longer is None:
        raise fail(subject, "test lengths", f"no length above {option}={length} is accepted (tried 2L, 2L+1, L+1, L+2)")
    shrink = {k: 1 for k in ("n_train", "n_val") if k in task.options}
    seq_lens = []
    for at in (length, longer):
        options = task.length_options([at])[at]
        where = f"seed={SEED} {' '.join(f'{k}={v}' for k, v in options.items())}"
        full = _build(subject, make, "test lengths", seed=SEED, **options)
        small = _build(subject, make, "test lengths", seed=SEED, **options, **shrink)
        for field in ("inputs", "targets", "weights", "valid"):
            if not np.array_equal(getattr(full.splits["test"], field), getattr(small.splits["test"], field)):
                raise fail(subject, "test lengths", f"test {field} change when n_train, n_val shrink to 1", where)
            same = np.array_equal(getattr(full.splits["test"], field), getattr(task.splits["test"], field))
            if at == length and not same:
                raise fail(subject, "test lengths", f"test {field} rebuilt at its own length differ", where)
        _split_arrays(subject, full, "test", full.splits["test"], where)
        seq_lens.append(full.seq_len)
    if not seq_lens[1] > seq_lens[0]:
        what = f"{option}={longer} gives seq_len {seq_lens[1]}, not above {seq_lens[0]}"
        raise fail(subject, "test lengths", what, f"seed={SEED}")
