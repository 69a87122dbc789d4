"""Test splits at lengths never trained on (`task.test_lengths`): the task rebuilt at each length with every
other option unchanged, its test split evaluated beside the ordinary one (train.evaluation)."""

from __future__ import annotations

from attnlab.checks import ConfigError
from attnlab.options import tasks as task_options

# What a length means, per task: the option test_lengths sets (MQAR: the same pairs in a longer context, or
# more with task.test_pairs).
LENGTH_OPTIONS = "mqar and lm (seq_len), icl_regression (n_points), max_retrieval (n_items)"
LENGTH_PREFIX = "test_len/"  # a length's split: its metrics are test_len/<T>/<metric> (metrics.json, TensorBoard)


def split_name(length: int) -> str:
    return f"{LENGTH_PREFIX}{length}"


# Position tables that stop at model.max_len (model.Transformer.embed_inputs).
TABLE_POSITIONALS = ("learned", "sinusoidal")


def length_tasks(task, test_lengths) -> dict:
    """{length: the task rebuilt at that length} (only its test split is read); {} without test_lengths.

    The rebuilt task keeps every option but the length (its train and val splits shrink to one example:
    disjoint_splits and the lm draw the test split first, from its own seeded stream, so it is the test
    split the task would have at that length; at the training length, the ordinary test split itself)."""
    task_options.test_lengths(test_lengths=test_lengths)
    lengths = sorted(int(t) for t in test_lengths or [])
    if not lengths:
        task.length_options([])  # refuses options that need test lengths (MQAR's list of test_pairs)
        return {}
    option = type(task).length_option
    if option is None:
        raise ConfigError(
            f"task.test_lengths={lengths} is not available for {type(task).__name__}: "
            f"{type(task).no_length_reason}; allowed with {LENGTH_OPTIONS}"
        )
    shrink = {k: 1 for k in ("n_train", "n_val") if k in task.options}
    out = {}
    for length, options in task.length_options([int(t) for t in test_lengths]).items():
        try:
            out[length] = type(task)(**{**task.options, **options, **shrink})
        except ConfigError as exc:
            raise ConfigError(f"task.test_lengths: at task.{option}={length}: {exc}") from None
    return dict(sorted(out.items()))


def check_positions(task, positional: str, max_len: int) -> None:
    """Refuse a test length whose sequences are longer than the model's position table, naming the fix."""
    longest = max((t.seq_len for t in task.at_lengths.values()), default=0)
    if positional in TABLE_POSITIONALS and longest > max_len:
        lengths = sorted(task.at_lengths)
        raise ConfigError(
            f"task.test_lengths={lengths} needs sequences of {longest} positions, beyond the "
            f"model.positional={positional} table of model.max_len={max_len}; raise model.max_len "
            f"to >= {longest} or use model.positional=rope or none"
        )
