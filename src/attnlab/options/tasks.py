"""The task group's options (attnlab.tasks), checked without jax or data: a bound that needs the data (the bytes a
corpus has, a split's length) is checked when the task is built."""

from __future__ import annotations

import math
import numbers

from attnlab import checks
from attnlab.checks import ConfigError

SPLITS = ("train", "val", "test")
INT32_MAX = 2**31 - 1


def check_int(name: str, value, lo: int, hi: int | None = INT32_MAX) -> int:
    """`task.<name>`: an integer in [lo, hi] (checks.integer). Every integer option ends up in an int32 array or a
    count of them, hence the default bound."""
    plain = int(value) if isinstance(value, numbers.Integral) and not isinstance(value, int) else value  # numpy's
    return int(checks.integer(f"task.{name}", plain, lo, hi))


def check_float(name: str, value, lo: float, hi: float | None = 1e6, lo_open: bool = False) -> float:
    """`task.<name>`: a finite number in [lo, hi] (or (lo, hi]; checks.real). The default bound keeps data in
    float32 range (a noise scale of 1e30 squares to inf)."""
    return checks.real(f"task.{name}", value, lo, math.inf if hi is None else hi, lo_open=lo_open)


def split_sizes(n_train, n_val, n_test) -> dict[str, int]:
    """{split: size} from the task.n_train / n_val / n_test options, each an integer >= 1."""
    return {s: check_int(f"n_{s}", n, 1) for s, n in zip(SPLITS, (n_train, n_val, n_test))}


def test_lengths(*, test_lengths) -> None:
    """task.test_lengths, every task's (Task.__init__): null or a list of distinct integers >= 1 (tasks.lengths)."""
    if test_lengths is None:
        return
    ok = isinstance(test_lengths, (list, tuple)) and all(checks.is_int(t) and t >= 1 for t in test_lengths)
    if not ok or len(set(test_lengths)) != len(test_lengths):
        raise ConfigError(
            f"task.test_lengths={test_lengths!r} is invalid; allowed: null or a list of distinct integers >= 1, "
            "e.g. [64,256]"
        )


TRANSITIONS = ("dirichlet", "bytes")  # bigram_backcopy's


def bigram_backcopy(
    *, num_tokens, seq_len, transitions, dirichlet_alpha, num_triggers, seed, n_train, n_val, n_test, fresh
):
    """The byte chain's bound (the distinct bytes of its corpus) is checked when built."""
    num_tokens = check_int("num_tokens", num_tokens, 2, 256 if transitions == "bytes" else 2**16)
    check_int("seq_len", seq_len, 2)
    if transitions not in TRANSITIONS:
        raise ConfigError(f"task.transitions={transitions!r} is invalid; allowed: {' | '.join(TRANSITIONS)}")
    check_float("dirichlet_alpha", dirichlet_alpha, 0.01, 1e4)
    check_int("num_triggers", num_triggers, 0, num_tokens - 1)
    check_int("seed", seed, 0)
    split_sizes(n_train, n_val, n_test)
    checks.boolean("task.fresh", fresh)


def digits(*, val_fraction, test_fraction, seed) -> None:
    test_fraction = check_float("test_fraction", test_fraction, 0.0, 0.5, lo_open=True)
    check_float("val_fraction", val_fraction, 0.0, 1.0 - test_fraction - 0.1, lo_open=True)
    check_int("seed", seed, 0)


def icl_regression(*, dim, n_points, noise_std, ridge, seed, n_train, n_val, n_test) -> None:
    check_int("dim", dim, 1)
    check_int("n_points", n_points, 1)
    check_float("noise_std", noise_std, 0.0)
    if ridge is not None:  # null: noise_std²
        check_float("ridge", ridge, 0.0)
    split_sizes(n_train, n_val, n_test)
    check_int("seed", seed, 0)


def max_tree_length(max_depth: int, max_args: int) -> int:
    """Longest expression (in tokens) listops' generator can produce: LRA's length counts op, args and ']'."""
    length = 1
    for _ in range(max_depth - 1):
        length = 2 + max_args * length
    return length


def listops(*, max_depth, max_args, min_length, max_length, seq_len, seed, n_train, n_val, n_test) -> None:
    max_depth = check_int("max_depth", max_depth, 2)
    max_args = check_int("max_args", max_args, 2)
    seq_len = check_int("seq_len", seq_len, 1)
    max_length = check_int("max_length", max_length, 1, seq_len)
    check_int("min_length", min_length, 1, min(max_length, max_tree_length(max_depth, max_args)))
    split_sizes(n_train, n_val, n_test)
    check_int("seed", seed, 0)


EVAL_BYTES = 32_000  # lm's n_val/n_test=auto: windows holding this many predicted bytes (500 at seq_len 64)


def eval_windows(name: str, n, seq_len: int):
    """lm's n_val/n_test: an integer as given; auto -> ceil(EVAL_BYTES / seq_len), so an evaluation costs the same
    positions at any seq_len (500 windows of 1024 bytes would evaluate ~10x the training bytes of a short run)."""
    if n == "auto":
        return -(-EVAL_BYTES // seq_len)
    if not checks.is_int(n) or n < 1:
        raise ConfigError(f"task.{name}={n!r} is invalid; allowed: auto or an integer >= 1")
    return n


def check_device_text_bytes(value) -> int:
    """lm's task.device_text_bytes: at most INT32_MAX, the largest text the device's int32 offsets index."""
    if isinstance(value, int) and not isinstance(value, bool) and value > INT32_MAX:
        raise ConfigError(
            f"task.device_text_bytes={value} is invalid; allowed: an integer in [0, {INT32_MAX}] "
            "(window offsets on the device are int32); a larger text streams from the host by itself"
        )
    return check_int("device_text_bytes", value, 0)


# The corpora attnlab ships (attnlab.tasks.lm.corpus.SHIPPED), read when task.path and task.hf_dataset are null.
CORPORA = ("pydoc_topics", "python_stdlib")


def lm(
    *,
    seq_len,
    corpus,
    path,
    hf_dataset,
    hf_config,
    hf_split,
    hf_column,
    hf_data_files,
    val_fraction,
    test_fraction,
    seed,
    n_train,
    n_val,
    n_test,
    device_text_bytes,
    bos,
    tokenizer,
    bpe_vocab_size,
) -> None:
    """What the corpus and the tokenizer file say (the text's length, a tokenizer that loads) is checked when built."""
    seq_len = check_int("seq_len", seq_len, 2)
    checks.boolean("task.bos", bos)
    if not (isinstance(tokenizer, str) and tokenizer.strip()):
        raise ConfigError(
            f"task.tokenizer={tokenizer!r} is invalid; allowed: bytes, bpe, or the path of a tokenizer.json "
            "(or a Hugging Face hub name)"
        )
    # The largest vocabulary whose BOS (the id past it) still fits the uint16 stream: 65535.
    check_int("bpe_vocab_size", bpe_vocab_size, 257, 2**16 - 1)
    for key, value in (
        ("path", path),
        ("hf_dataset", hf_dataset),
        ("hf_config", hf_config),
        ("hf_split", hf_split),
        ("hf_column", hf_column),
        ("hf_data_files", hf_data_files),
    ):
        if value is not None and not (isinstance(value, str) and value):
            raise ConfigError(
                f"task.{key}={value!r} is invalid; allowed: a non-empty string"
                + ("" if key in ("hf_split", "hf_column") else " or null")
            )
    if path is not None and hf_dataset is not None:
        raise ConfigError(
            f"task.path={path!r} and task.hf_dataset={hf_dataset!r} exclude each other; allowed: one or neither"
        )
    checks.choice("task.corpus", corpus, CORPORA)
    if corpus != CORPORA[0] and (path is not None or hf_dataset is not None):
        given = f"task.path={path!r}" if path is not None else f"task.hf_dataset={hf_dataset!r}"
        raise ConfigError(
            f"task.corpus={corpus} and {given} exclude each other; allowed: a shipped corpus (path and hf_dataset "
            "null) or your own text (corpus left at pydoc_topics)"
        )
    check_float("test_fraction", test_fraction, 0.0, 0.5, lo_open=True)
    check_float("val_fraction", val_fraction, 0.0, 0.5, lo_open=True)
    for s, n in zip(SPLITS, (n_train, n_val, n_test)):
        check_int(f"n_{s}", eval_windows(f"n_{s}", n, seq_len), 1)
    check_int("seed", seed, 0)
    check_device_text_bytes(device_text_bytes)


def max_retrieval(*, n_items, min_items, num_classes, seed, n_train, n_val, n_test) -> None:
    n_items = check_int("n_items", n_items, 1, 2**24)
    if min_items is not None:  # null: every set has n_items items
        if check_int("min_items", min_items, 1, 2**24) > n_items:
            raise ConfigError(
                f"task.min_items={min_items} is invalid; allowed: 1 <= min_items <= "
                f"task.n_items={n_items} (or null: every set has n_items items)"
            )
    check_int("num_classes", num_classes, 2, 2**16)
    split_sizes(n_train, n_val, n_test)
    check_int("seed", seed, 0)


def mqar_max_pairs(seq_len: int, vocab_size: int) -> int:
    """MQAR's most pairs at a length: 2k context tokens plus k queries at even offsets need 4k positions (zoology
    asserts the same), and k distinct keys from [1, V/2)."""
    return min(seq_len // 4, vocab_size // 2 - 1)


TEST_PAIRS_ALLOWED = "same, scale, or a list of integers >= 1, one per test length (e.g. [8,16])"


def mqar(
    *, vocab_size, seq_len, num_kv_pairs, power_a, random_filler, test_pairs, seed, n_train, n_val, n_test
) -> None:
    """Whether each test length holds its test_pairs is checked when built (MQAR.length_options)."""
    vocab_size = check_int("vocab_size", vocab_size, 4)
    seq_len = check_int("seq_len", seq_len, 4)
    check_int("num_kv_pairs", num_kv_pairs, 1, mqar_max_pairs(seq_len, vocab_size))
    check_float("power_a", power_a, 0.0, lo_open=True)
    checks.boolean("task.random_filler", random_filler)
    ok = test_pairs in ("same", "scale") or (
        isinstance(test_pairs, (list, tuple)) and test_pairs and all(checks.is_int(k) and k >= 1 for k in test_pairs)
    )
    if not ok:
        raise ConfigError(f"task.test_pairs={test_pairs!r} is invalid; allowed: {TEST_PAIRS_ALLOWED}")
    split_sizes(n_train, n_val, n_test)
    check_int("seed", seed, 0)


DECLARED = {
    "attnlab.tasks.BigramBackcopy": (bigram_backcopy, test_lengths),
    "attnlab.tasks.Digits": (digits, test_lengths),
    "attnlab.tasks.ICLRegression": (icl_regression, test_lengths),
    "attnlab.tasks.LanguageModel": (lm, test_lengths),
    "attnlab.tasks.ListOps": (listops, test_lengths),
    "attnlab.tasks.MaxRetrieval": (max_retrieval, test_lengths),
    "attnlab.tasks.MQAR": (mqar, test_lengths),
}
