"""The Split / Task contract shared by every task, plus helpers for validation and disjoint splits."""

from __future__ import annotations

import dataclasses
import types
from typing import Callable

import numpy as np

from attnlab.checks import ConfigError

# A task's helpers (REFERENCE.md, Tasks), declared with the tasks' options: attnlab.options.tasks.
from attnlab.options.tasks import INT32_MAX, SPLITS, check_float, check_int, split_sizes  # noqa: F401
from attnlab.tasks.batches import Rows


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of a task: aligned numpy arrays, first axis = examples."""

    inputs: np.ndarray  # int32 (N,T) token ids, or float32 (N,T,D) continuous vectors
    targets: np.ndarray  # classification: int32 (N,T) or (N,); regression: float32, same shapes
    weights: np.ndarray  # float32, shape of targets: 1 where a target counts, 0 elsewhere
    valid: np.ndarray  # bool (N,T): True for real tokens, False for padding

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def take(self, index) -> "Split":
        """The sub-split of the given rows (an index array, a slice or a boolean mask)."""
        return Split(self.inputs[index], self.targets[index], self.weights[index], self.valid[index])

    @staticmethod
    def concat(parts: list["Split"]) -> "Split":
        """Row-wise concatenation of splits with matching shapes."""
        return Split(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(Split)))


class Task:
    """A supervised dataset with train/val/test splits, described well enough to build a model and a loss.

    Every task is fully materialised at construction as numpy arrays (jax only draws the batches): the
    ``splits`` dict maps ``"train"``, ``"val"`` and ``"test"`` to a :class:`Split`, generated
    deterministically from the ``seed`` option with a ``numpy.random.Generator``. The same
    options always give the same arrays; a different seed gives different ones. No input row
    appears in two splits (duplicates are dropped and redrawn), so validation and test
    accuracy measure generalisation, not memorisation.

    A :class:`Split` holds four aligned arrays whose first axis indexes examples:

    * ``inputs`` -- either int32 ``(N, T)`` token ids in ``[0, vocab_size)`` (then
      ``vocab_size`` is set and ``input_dim`` is None: the model embeds them), or float32
      ``(N, T, D)`` continuous vectors with ``D == input_dim`` (then ``vocab_size`` is None: the
      model projects them linearly). Exactly one of ``vocab_size`` / ``input_dim`` is set.
    * ``targets`` -- what the head predicts. Its shape is set by ``granularity``:

      - ``"token"``: ``(N, T)``, one target per position. The label at position ``t`` must be
        predictable from positions ``0..t`` only, so the model is causal and the head is
        applied to every position's feature.
      - ``"sequence"``: ``(N,)``, one target per example. The model is bidirectional and the
        head is applied to a feature pooled over the ``valid`` positions.

      Its dtype is set by ``kind``: ``"classification"`` -> int32 class ids in
      ``[0, num_classes)``; ``"regression"`` -> float32 values (``num_classes`` is None).
    * ``weights`` -- float32, same shape as ``targets``: 1 where a target counts towards the
      loss and the metrics, 0 elsewhere (e.g. MQAR counts only query positions). Losses and
      metrics are weighted means ``sum(w * l) / sum(w)``; targets under weight 0 are
      placeholders (0) and must be ignored.
    * ``valid`` -- bool ``(N, T)``: True for real tokens, False for right-padding. This is the
      key-padding mask of attention and the pooling mask; padded tokens have id 0 (or zero
      vectors).

    Attributes describing the task (read them, never infer from the arrays):

    * ``kind`` -- ``"classification"`` or ``"regression"``.
    * ``granularity`` -- ``"token"`` or ``"sequence"`` (see ``targets``).
    * ``seq_len`` -- ``T``, the length every example is padded to.
    * ``vocab_size`` / ``input_dim`` -- see ``inputs``.
    * ``num_classes`` -- number of classes (classification only, else None).
    * ``default_head`` -- name of the head used when the experiment names none
      (``"softmax_ce"`` for classification, ``"mse"`` for regression); a config option.
    * ``options`` -- the constructor options, for logging and reproduction.

    ``baseline(split)`` returns reference scores on a split, to read a model's numbers
    against: classification -> ``{"accuracy": chance or majority-class accuracy}``;
    regression -> ``{"mse": a reference estimator's error (e.g. least squares on the
    context), "mse_zero": the error of always predicting 0}``, both weighted by ``weights``.

    What a run is judged by, declared here and read everywhere (TensorBoard's first charts, and
    through metrics.json's ``headline`` and ``baseline_labels`` (``judged_by``) the run summary's
    headline, a sweep's job lines and the report):

    * ``headline_metric`` -- the val/test metric a run is judged by: ``"accuracy"`` for
      classification, ``"mse"`` for regression by default.
    * ``baseline_labels`` -- ``{metric: {baseline key: label}}``: which of ``baseline()``'s
      numbers each metric is read against, and what to call them (``chance``, ``majority class``).

    How a step draws its batch: ``batches(...)`` returns the training data every step draws
    from (attnlab.tasks.batches): by default the train split resident on the device, rows
    drawn at random; a task may instead draw fresh examples each step (the lm task's windows
    of its whole training text), or stream them from the host (``streamed`` data;
    ``train_data`` then says ``"host-stream"`` instead of ``"device"``).

    Text: ``is_text`` is True for a task whose tokens are text; it then decodes them
    (``decode``: the shown example's text and the attention images' character labels in TensorBoard)
    and may say how a model continues a prompt (``continuation``, logged on eval steps).

    Tasks are built from their YAML in ``configs/task/<name>.yaml`` via
    ``attnlab.config.task(name, **overrides)``; every constructor option appears there with
    its default.
    """

    kind: str
    granularity: str
    seq_len: int
    vocab_size: int | None = None
    input_dim: int | None = None
    num_classes: int | None = None
    default_head: str
    splits: dict[str, Split]
    options: dict
    train_data = "device"  # or "host-stream": each step's data comes from the host (`batches`; run.json)
    is_text = False  # True: tokens are text, `decode` turns them back into it
    # True: the task exists to measure attention sinks, so trainer.final_stats and model.extreme_token_stats, left
    # null, are on under it (config.assembly.sink_statistics)
    measures_sinks = False
    # task.test_lengths (tasks.lengths): the option a length sets, or None and why the task has none.
    length_option: str | None = None
    no_length_reason = "it has no length option"
    at_lengths: dict = types.MappingProxyType({})  # length -> the task rebuilt at it (tasks.lengths.length_tasks)
    # Options at which a short run takes seconds (attnlab's own tests), beyond the split sizes every task with
    # n_train, n_val, n_test is shrunk to: only the sizes its defaults make too large.
    tiny_options: dict = types.MappingProxyType({})
    test_lengths: list[int] | None = None  # a task whose constructor passes no options on to Task's has none

    def __init__(self, *, test_lengths: list[int] | None = None):
        """The options every task takes, its own constructor passing them on (`**shared`): `test_lengths`, the lengths
        its test split is rebuilt at once it is built (tasks.lengths, attnlab.config.task_from_node)."""
        self.test_lengths = test_lengths

    def length_options(self, lengths: list[int]) -> dict[int, dict]:
        """{length: the options the task is rebuilt with at it} for task.test_lengths (tasks.lengths)."""
        return {t: {self.length_option: t} for t in lengths}

    def baseline(self, split: str) -> dict[str, float]:
        """Reference scores on a split (chance/majority accuracy, or reference and zero-predictor MSE)."""
        raise NotImplementedError

    @property
    def headline_metric(self) -> str:
        """The metric a run is judged by: accuracy for classification, MSE for regression."""
        return "accuracy" if self.kind == "classification" else "mse"

    @property
    def baseline_labels(self) -> dict[str, dict[str, str]]:
        """{metric: {key of baseline(): label}}: what each metric is read against."""
        if self.kind == "classification":
            return {"accuracy": {"accuracy": "chance"}}
        return {"mse": {"mse": "reference estimator", "mse_zero": "zero predictor"}}

    def plateaus(self) -> dict[str, dict[str, float]]:
        """{test metric: {label: value}}: values the metric sits at before the model has learnt the task (a run there
        is flagged: attnlab.run.convergence); none by default."""
        return {}

    def judged_by(self) -> dict:
        """What metrics.json says a run is judged by: `headline`, the test metric (test/<headline_metric>), and
        `baseline_labels`, {test metric: {baseline key: label}} (the keys of metrics.json's final and baseline)."""
        return {
            "headline": f"test/{self.headline_metric}",
            "baseline_labels": {
                f"test/{m}": {f"baseline/{k}": label for k, label in refs.items()}
                for m, refs in self.baseline_labels.items()
            },
        }

    def batches(self, batch_size: int, key_data_S2=None, *, start: int = 0, stop: int | None = None, sharding=None):
        """What every training step draws its batch from (attnlab.tasks.batches), in host memory; the caller
        places resident data on the devices. `key_data_S2` (the seeds' raw keys), `start`/`stop` (the steps to
        run) and `sharding` (one seed's data per device) serve a task whose data is streamed.
        Default: the train split, `batch_size` rows drawn at random each step."""
        split = self.splits["train"]
        return Rows({f.name: np.asarray(getattr(split, f.name)) for f in dataclasses.fields(split)})

    def decode(self, tokens_T) -> str:
        """Token ids back to text; only a task with is_text has it."""
        raise TypeError(f"{type(self).__name__} is not a text task (is_text=False): its tokens do not decode")

    def continuation(self, graphdef) -> Callable | None:
        """(params, rest, inputs_1T, valid_1T) -> (1, L) tokens: the shown example's prompt and the model's continuation
        of it, for one seed; None (the default): the task logs no sample."""
        return None

    def split_continuation(self, written_L) -> tuple[str, str]:
        """A continuation's tokens as (prompt text, written text)."""
        raise TypeError(f"{type(self).__name__} writes no continuation")

    def scored_positions(self) -> int | None:
        """k: the most positions of one example any split gives weight, when a token task scores fewer than
        all T (the head and loss then run on k positions: steps.scored); None otherwise."""
        if self.granularity != "token":
            return None
        k = max(int((np.asarray(s.weights) > 0).sum(1).max(initial=0)) for s in self.splits.values())
        return k if 0 < k < self.seq_len else None

    def row_groups(self, inputs_NT: np.ndarray) -> dict[str, np.ndarray]:
        """{group: bool (N, T)}: named subsets of the query rows (e.g. trigger / dormant rows); {} by default."""
        return {}

    def derived_metrics(self, metrics: dict[str, float], split: str) -> dict[str, float]:
        """Task-specific metrics computed from the head metrics of `split` (val, test or test_len/<T>; e.g. bits per
        byte); none by default."""
        return {}

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.splits.items())
        return f"{type(self).__name__}({self.options}; {sizes})"


def disjoint_splits(
    sample: Callable[[np.random.Generator, int], Split], sizes: dict[str, int], seed: int, max_rounds: int = 50
) -> dict[str, Split]:
    """Draw each split from its own seeded stream and drop any input row already drawn.

    Each split has its own child of ``SeedSequence(seed)``, and the splits are filled in the
    order test, val, train: so the test set does not change when ``n_train`` does.
    """
    children = dict(zip(SPLITS, np.random.SeedSequence(seed).spawn(len(SPLITS))))
    seen: set[bytes] = set()
    out: dict[str, Split] = {}
    for name in ("test", "val", "train"):
        rng, n, parts, have = np.random.default_rng(children[name]), sizes[name], [], 0
        for round_ in range(max_rounds):
            if have >= n:
                break
            # Redraws oversample: when few distinct sequences remain, a draw of exactly the shortfall rarely hits them.
            batch = sample(rng, n - have if round_ == 0 else 4 * (n - have) + 64)
            keep = []
            for i, row in enumerate(batch.inputs):
                key = row.tobytes()
                if key not in seen and have + len(keep) < n:
                    seen.add(key)
                    keep.append(i)
            parts.append(batch.take(np.asarray(keep, dtype=np.int64)))
            have += len(keep)
        if have < n:
            raise ConfigError(
                f"could only draw {have} distinct examples for the {name} split (task.n_{name}={n}); "
                "the options allow too few distinct sequences: enlarge the vocabulary/length or shrink n_*"
            )
        out[name] = Split.concat(parts)
    return {name: out[name] for name in SPLITS}


def majority_accuracy(train_targets: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> float:
    """Weighted accuracy on `targets` of always predicting the most frequent train class."""
    majority = np.argmax(np.bincount(train_targets.ravel(), minlength=1))
    w = weights.astype(np.float64)
    return float((w * (targets == majority)).sum() / max(w.sum(), 1e-12))
