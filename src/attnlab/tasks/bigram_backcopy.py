"""Bigram-Backcopy (Guo, Pai, Bai, Jiao, Jordan, Mei 2024, "Active-Dormant Attention Heads", arXiv 2410.13835)."""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.checks import ConfigError
from attnlab.options import tasks as task_options
from attnlab.tasks.base import Split, Task, disjoint_splits, split_sizes
from attnlab.tasks.batches import Resident
from attnlab.tasks.lm import corpus

PAD = 0  # input id 0 is padding (never used: every row is full length); token v is input id v + 1, <s> is V + 1
CHAIN_STREAM = 3  # SeedSequence(seed, spawn_key=(3,)): the Dirichlet chain's stream, apart from the splits' (0, 1, 2)
FIT_STREAM = 4  # ... and (4,): the sample the unigram and bigram baselines are fitted on
FIT_SEQUENCES, FIT_LENGTH = 4096, 64  # that sample: 262,144 targets, at any seq_len and n_train


def dirichlet_chain(num_tokens: int, alpha: float, seed: int) -> np.ndarray:
    """(V, V) float64 transition matrix: each row drawn from Dirichlet(alpha, ..., alpha), seeded by `seed`."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(CHAIN_STREAM,)))
    P = rng.dirichlet(np.full(num_tokens, alpha), size=num_tokens)
    if not (np.isfinite(P).all() and np.allclose(P.sum(1), 1.0)):
        raise ConfigError(f"task.dirichlet_alpha={alpha} draws degenerate rows; allowed: a larger concentration")
    return P / P.sum(1, keepdims=True)


def byte_chain(num_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The byte bigrams of the lm task's default corpus (CPython's pydoc topics, documents joined as the lm task joins
    them), restricted to its `num_tokens` most frequent bytes: (P (V, V) float64, stationary (V,), bytes (V,) uint8).

    The text is read with every other byte removed and as a cycle (its last byte followed by its first), so every kept
    byte has a row and the byte frequencies of that text are exactly the chain's stationary distribution."""
    docs, _ = corpus.pydoc_topics()
    text = np.frombuffer(corpus.SEPARATOR.join(docs), np.uint8)
    counts = np.bincount(text, minlength=256)
    distinct = int((counts > 0).sum())
    if num_tokens > distinct:
        raise ConfigError(
            f"task.num_tokens={num_tokens} with task.transitions=bytes: the corpus has {distinct} distinct bytes; "
            f"allowed: at most {distinct}"
        )
    order = np.lexsort((np.arange(256), -counts))  # most frequent first, ties by byte value
    kept = np.sort(order[:num_tokens]).astype(np.uint8)
    index = np.full(256, -1, np.int64)
    index[kept] = np.arange(num_tokens)
    ids = index[text]
    ids = ids[ids >= 0]
    joint = np.bincount(ids * num_tokens + np.roll(ids, -1), minlength=num_tokens**2).reshape(num_tokens, num_tokens)
    freq = np.bincount(ids, minlength=num_tokens).astype(np.float64)
    return joint / joint.sum(1, keepdims=True), freq / freq.sum(), kept


def stationary(P: np.ndarray, iters: int = 100_000, tol: float = 1e-15) -> np.ndarray:
    """The stationary distribution of the chain P (power iteration of the lazy chain (I + P) / 2, from uniform)."""
    pi = np.full(len(P), 1.0 / len(P))
    for _ in range(iters):
        nxt = 0.5 * (pi + pi @ P)
        if np.abs(nxt - pi).max() < tol:
            return nxt / nxt.sum()
        pi = nxt
    return pi / pi.sum()


def draw_rows(rng: np.random.Generator, cdf_NV: np.ndarray) -> np.ndarray:
    """One index per row of the cumulative distributions `cdf_NV` (inverse CDF; a probability-0 entry is never
    drawn)."""
    u = (1.0 - rng.random(len(cdf_NV))) * cdf_NV[:, -1]  # in (0, total]
    return np.minimum((cdf_NV < u[:, None]).sum(1), cdf_NV.shape[1] - 1)


def _nll(probs_X: np.ndarray) -> np.ndarray:
    return -np.log(np.maximum(probs_X, 1e-300))


@dataclasses.dataclass(frozen=True)
class FreshChain(Resident):
    """task.fresh: the chain on the device; a step draws batch_size new sequences from it with the step's key (a
    function of the seed and the step: a resumed run draws the same), by the rule of BigramBackcopy._sample."""

    log_first_V: jax.Array  # log of x_1's distribution (-inf on the triggers)
    log_transition_VV: jax.Array  # log P
    is_trigger_V: jax.Array
    seq_len: int
    bos: int

    def draw(self, key, batch_size: int) -> dict:
        keys = jax.random.split(key, self.seq_len)
        x1_B = jax.random.categorical(keys[0], self.log_first_V, shape=(batch_size,))

        def next_token(carry, key_t):
            before_B, x_B = carry  # x_{t-1}, x_t; x_1 is no trigger, so x_0's stand-in (x_1) is never copied
            drawn_B = jax.random.categorical(key_t, self.log_transition_VV[x_B])
            nxt_B = jnp.where(self.is_trigger_V[x_B], before_B, drawn_B)
            return (x_B, nxt_B), nxt_B

        _, rest_TB = jax.lax.scan(next_token, (x1_B, x1_B), keys[1:])
        x_BT = jnp.concatenate([x1_B[:, None], rest_TB.T], axis=1).astype(jnp.int32)  # x_1 .. x_T
        inputs = jnp.concatenate([jnp.full((batch_size, 1), self.bos, jnp.int32), x_BT[:, :-1] + 1], axis=1)
        ones_BT = jnp.ones(x_BT.shape, jnp.float32)
        return {"inputs": inputs, "targets": x_BT, "weights": ones_BT, "valid": ones_BT.astype(bool)}


jax.tree_util.register_dataclass(
    FreshChain,
    data_fields=["log_first_V", "log_transition_VV", "is_trigger_V"],
    meta_fields=["seq_len", "bos"],
)


class BigramBackcopy(Task):
    """Bigram-Backcopy: a bigram chain whose few most frequent tokens, the triggers, are followed by a copy.

    After Guo et al. 2024 (their code's `bbm` data, GuoTianYu2000/Active-Dormant-Attention): V ordinary tokens with
    a bigram transition matrix P, and a beginning-of-sequence token ``<s>``. The ``num_triggers`` tokens most
    frequent under P's stationary distribution are triggers. A sequence is ``<s> x_1 x_2 ...``: x_1 is drawn from the
    stationary distribution with the triggers removed (renormalised); after a trigger x_t, x_{t+1} = x_{t-1} (the
    token before the trigger: a one-layer head copies it when active); otherwise x_{t+1} ~ P[x_t]. Two triggers are
    never adjacent (x_1 is no trigger, and a copy is of the token before a trigger, which is none), so the copy is
    always defined.

    ``transitions``: ``dirichlet`` (default) draws each row of P from Dirichlet(dirichlet_alpha) with V =
    ``num_tokens``, seeded by ``seed`` (its own stream, apart from the splits'); ``bytes`` uses the byte bigrams of the
    lm task's default corpus (byte_chain), restricted to its ``num_tokens`` most frequent bytes (token i is the i-th
    kept byte in byte order, ``symbols``); Guo et al. use the character bigrams of a text too.

    Token ids (as the lm task's): input id 0 is padding (never present: every sequence is full length), token v is
    input id v + 1 and ``<s>`` is input id V + 1 (``vocab_size`` = V + 2); targets are the tokens v in [0, V)
    (``num_classes`` = V: ``<s>`` is never predicted). Input row t holds x_t (``<s>`` at t = 0) and its target is
    x_{t+1}, weight 1 at every position: next-token prediction of seq_len tokens.

    ``fresh``: false (default) trains on the ``n_train`` sequences of the train split; true draws ``batch_size`` new
    sequences from the process every step (FreshChain), as Guo et al.'s code does; the train split stays what the
    train-split metrics read.

    ``row_groups``: ``trigger`` rows (the input is a trigger: the target is a copy) and ``dormant`` rows (every other
    valid row, the ``<s>`` row 0 included: the target is drawn from the chain). ``baseline`` gives, per split, the
    Bayes-optimal scores under the true process (trigger rows: loss 0, accuracy 1; dormant rows: the mean NLL of the
    split's actual targets under P, or the first-token distribution at row 0), beside the unigram and bigram
    predictors fitted on a sample of the process (add-one smoothed counts of the target, and of the target given the
    input id; `_fit_predictors`).
    """

    kind = "classification"
    granularity = "token"
    measures_sinks = True  # the dormant rows' first-key weight, value drain and residual peak (Guo et al. 2024)
    length_option = "seq_len"  # task.test_lengths sets it
    tiny_options = types.MappingProxyType({"seq_len": 16, "num_tokens": 16})

    def __init__(
        self,
        num_tokens: int = 64,
        seq_len: int = 64,
        transitions: str = "dirichlet",
        dirichlet_alpha: float = 0.1,
        num_triggers: int = 3,
        seed: int = 0,
        n_train: int = 20000,
        n_val: int = 1000,
        n_test: int = 1000,
        fresh: bool = False,
        default_head: str = "softmax_ce",
        **shared,
    ):
        super().__init__(**shared)  # the options every task takes (Task.__init__)
        task_options.bigram_backcopy(
            num_tokens=num_tokens,
            seq_len=seq_len,
            transitions=transitions,
            dirichlet_alpha=dirichlet_alpha,
            num_triggers=num_triggers,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            fresh=fresh,
        )
        V = self.num_tokens = int(num_tokens)
        self.seq_len, self.transitions = int(seq_len), transitions
        self.dirichlet_alpha, self.num_triggers, seed = float(dirichlet_alpha), int(num_triggers), int(seed)
        self.fresh = fresh
        sizes = split_sizes(n_train, n_val, n_test)
        self.vocab_size, self.num_classes, self.input_dim = V + 2, V, None
        self.bos = V + 1  # the input id of <s>
        self.default_head = default_head
        self.options = dict(
            num_tokens=num_tokens,
            seq_len=seq_len,
            transitions=transitions,
            dirichlet_alpha=dirichlet_alpha,
            num_triggers=num_triggers,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            fresh=fresh,
            default_head=default_head,
        )
        if transitions == "bytes":
            self.transition, self.stationary, self.symbols = byte_chain(V)
        else:
            self.transition, self.symbols = dirichlet_chain(V, self.dirichlet_alpha, seed), None
            self.stationary = stationary(self.transition)
        # The most frequent tokens, ties by token id (a stable sort of the negated frequencies).
        self.triggers = np.sort(np.argsort(-self.stationary, kind="stable")[: self.num_triggers])
        self.is_trigger = np.zeros(V, bool)
        self.is_trigger[self.triggers] = True
        first = np.where(self.is_trigger, 0.0, self.stationary)
        self.first = first / first.sum()  # x_1's distribution: the stationary one without the triggers
        # True conditional of the target given the input id at a dormant row (<s>: first; padding, triggers: unused).
        self.dormant_probs = np.zeros((V + 2, V))
        self.dormant_probs[1 : V + 1] = self.transition
        self.dormant_probs[self.bos] = self.first
        self.splits = disjoint_splits(self._sample, sizes, seed)
        self._fit_predictors(seed)
        self._baselines = {s: self._baseline(s) for s in self.splits}

    def _sample(self, rng: np.random.Generator, n: int, length: int | None = None) -> Split:
        """n sequences <s> x_1 .. x_{T-1} with targets x_1 .. x_T, T = seq_len (the caller drops duplicates)."""
        T = self.seq_len if length is None else length
        x = np.zeros((n, T + 1), np.int64)  # x[:, 0] stands for <s>; x[:, t] = x_t
        cdf = np.cumsum(self.transition, axis=1)
        x[:, 1] = draw_rows(rng, np.broadcast_to(np.cumsum(self.first), (n, self.num_tokens)))
        for t in range(1, T):
            drawn = draw_rows(rng, cdf[x[:, t]])
            copy = self.is_trigger[x[:, t]] & (t >= 2)
            x[:, t + 1] = np.where(copy, x[:, t - 1], drawn)
        inputs = (x[:, :T] + 1).astype(np.int32)
        inputs[:, 0] = self.bos
        targets = x[:, 1:].astype(np.int32)
        return Split(inputs, targets, np.ones((n, T), np.float32), np.ones((n, T), bool))

    def batches(self, batch_size: int, key_data_S2=None, *, start: int = 0, stop: int | None = None, sharding=None):
        """task.fresh: new sequences every step (FreshChain); else the train split's rows (Task.batches)."""
        if not self.fresh:
            return super().batches(batch_size, key_data_S2, start=start, stop=stop, sharding=sharding)
        with np.errstate(divide="ignore"):  # a probability 0 is a log of -inf: never drawn
            log_first, log_transition = np.log(self.first), np.log(self.transition)
        return FreshChain(
            log_first.astype(np.float32), log_transition.astype(np.float32), self.is_trigger, self.seq_len, self.bos
        )

    def row_groups(self, inputs_NT: np.ndarray) -> dict[str, np.ndarray]:
        """{"trigger": rows whose input is a trigger (the target copies the token before it), "dormant": every other
        valid row (<s> included)}; padding rows are in neither."""
        inputs_NT = np.asarray(inputs_NT)
        trigger_id = np.zeros(self.vocab_size, bool)
        trigger_id[self.triggers + 1] = True
        trigger = trigger_id[inputs_NT]
        return {"trigger": trigger, "dormant": (inputs_NT != PAD) & ~trigger}

    def _fit_predictors(self, seed: int):
        """Add-one smoothed unigram (target) and bigram (target given input id) predictors, fitted on FIT_SEQUENCES
        sequences of FIT_LENGTH tokens from the process (their own seeded stream) rather than the train split: the
        baselines then do not move with n_train, and a test length's rebuild (train split shrunk to one example,
        tasks.lengths) reads the same predictors."""
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(FIT_STREAM,)))
        s = self._sample(rng, FIT_SEQUENCES, FIT_LENGTH)
        w = s.weights > 0
        V = self.num_tokens
        uni = np.bincount(s.targets[w], minlength=V).astype(np.float64) + 1.0
        self.unigram = uni / uni.sum()
        big = np.bincount(s.inputs[w].astype(np.int64) * V + s.targets[w], minlength=self.vocab_size * V)
        big = big.reshape(self.vocab_size, V).astype(np.float64) + 1.0
        self.bigram = big / big.sum(1, keepdims=True)

    def bayes_nll(self, split: Split) -> np.ndarray:
        """(N, T) float64: each target's NLL under the true process (0 on trigger rows, whose target is certain)."""
        groups = self.row_groups(split.inputs)
        nll = _nll(self.dormant_probs[split.inputs, split.targets])
        return np.where(groups["dormant"], nll, 0.0)

    def _baseline(self, name: str) -> dict[str, float]:
        s = self.splits[name]
        groups = self.row_groups(s.inputs)
        w = s.weights.astype(np.float64)
        rows = {"": w, "dormant/": w * groups["dormant"], "trigger/": w * groups["trigger"]}

        def mean(values, weight):
            return float((values * weight).sum() / weight.sum()) if weight.sum() > 0 else 0.0

        bayes_nll = self.bayes_nll(s)
        bayes_hit = np.where(groups["dormant"], self.dormant_probs[s.inputs].argmax(-1) == s.targets, True)
        uni_nll = _nll(self.unigram[s.targets])
        big_nll = _nll(self.bigram[s.inputs, s.targets])
        big_hit = self.bigram[s.inputs].argmax(-1) == s.targets
        out = {"accuracy": mean(s.targets == self.unigram.argmax(), w)}  # the majority token of the train split
        for prefix, weight in rows.items():
            out |= {
                f"{prefix}accuracy_bayes" if not prefix else f"{prefix}accuracy": mean(bayes_hit, weight),
                f"{prefix}loss": mean(bayes_nll, weight),
                f"{prefix}accuracy_bigram": mean(big_hit, weight),
                f"{prefix}loss_bigram": mean(big_nll, weight),
                f"{prefix}loss_unigram": mean(uni_nll, weight),
            }
        return out

    def baseline(self, split: str) -> dict[str, float]:
        """Per split: `accuracy` (always the train split's majority token), and for all rows, and for the `dormant/`
        and `trigger/` rows, the Bayes-optimal `loss` and accuracy (`accuracy_bayes` for all rows; `dormant/accuracy`,
        `trigger/accuracy`) under the true process, and the train-fitted bigram (`loss_bigram`, `accuracy_bigram`) and
        unigram (`loss_unigram`) predictors' scores."""
        return dict(self._baselines[split])

    @property
    def baseline_labels(self) -> dict[str, dict[str, str]]:
        """Accuracy against the majority token and the bigram predictor; each loss and group accuracy against the
        Bayes-optimal value too (a bar to reach: the weakest of a metric's baselines is the one to beat). Each in key
        order, the order metrics.json keeps them in."""
        out = {
            "accuracy": {"accuracy": "majority token", "accuracy_bayes": "Bayes-optimal", "accuracy_bigram": "bigram"},
            "loss": {"loss": "Bayes-optimal", "loss_bigram": "bigram", "loss_unigram": "unigram"},
        }
        for group in ("dormant", "trigger"):
            out[f"{group}/accuracy"] = {f"{group}/accuracy": "Bayes-optimal", f"{group}/accuracy_bigram": "bigram"}
            out[f"{group}/loss"] = {
                f"{group}/loss": "Bayes-optimal",
                f"{group}/loss_bigram": "bigram",
                f"{group}/loss_unigram": "unigram",
            }
        return out

    def plateaus(self) -> dict[str, dict[str, float]]:
        """Before learning: test accuracy at the majority token's rate; before the copy is learnt: trigger rows'
        accuracy at the bigram predictor's (the chain's most likely successor of a trigger)."""
        b = self._baselines["test"]
        return {
            "test/accuracy": {"majority token": b["accuracy"]},
            "test/trigger/accuracy": {"bigram": b["trigger/accuracy_bigram"]},
        }
