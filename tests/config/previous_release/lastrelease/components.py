"""A normalizer, a task and a head as a user wrote them for the release before this one."""

from __future__ import annotations

import numpy as np

from attnlab.heads import SoftmaxCE
from attnlab.normalizers import ScoreNormalizer, masked_softmax
from attnlab.tasks.base import Split, Task, disjoint_splits, majority_accuracy, split_sizes


class HalvedSoftmax(ScoreNormalizer):
    """softmax(z / (2√H)): softmax at half its usual inverse temperature, fixed."""

    def __init__(self, *, num_heads, head_dim, rngs, impl="auto"):
        self.scale = 0.5 / head_dim**0.5
        self.set_impl(impl, None, head_dim)

    def normalize(self, z_BNTS, m_B1TS):
        logits_BNTS = self.scale * z_BNTS
        return masked_softmax(logits_BNTS, m_B1TS), logits_BNTS, {}

    def reference(self, q_BNTH, k_BNSH, admissible_BTS):
        z_BNTS = np.einsum("bnth,bnsh->bnts", np.asarray(q_BNTH, np.float64), np.asarray(k_BNSH, np.float64))
        logits_BNTS = self.scale * z_BNTS
        weights_BNTS = np.zeros_like(logits_BNTS)
        for b, n, t in np.ndindex(logits_BNTS.shape[:3]):
            keys = np.flatnonzero(admissible_BTS[b, t])
            if keys.size:
                e = np.exp(logits_BNTS[b, n, t, keys] - logits_BNTS[b, n, t, keys].max())
                weights_BNTS[b, n, t, keys] = e / e.sum()
        return weights_BNTS, logits_BNTS, {}


class FirstToken(Task):
    """Classify a sequence of random tokens by its first token. Written before tasks took `test_lengths`: the
    constructor neither takes it nor calls Task.__init__ (the config layer read it around the class)."""

    kind = "classification"
    granularity = "sequence"
    baseline_labels = {"accuracy": {"accuracy": "majority class"}}

    def __init__(self, length=8, vocab=4, n_train=256, n_val=64, n_test=64, seed=0, default_head="softmax_ce"):
        self.seq_len, self.vocab_size, self.num_classes, self.default_head = length, vocab, vocab, default_head
        self.options = dict(
            length=length,
            vocab=vocab,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            seed=seed,
            default_head=default_head,
        )
        self.splits = disjoint_splits(self._sample, split_sizes(n_train, n_val, n_test), seed)

    def _sample(self, rng: np.random.Generator, n: int) -> Split:
        tokens = rng.integers(0, self.vocab_size, size=(n, self.seq_len)).astype(np.int32)
        return Split(tokens, tokens[:, 0].copy(), np.ones(n, np.float32), np.ones_like(tokens, bool))

    def baseline(self, split: str) -> dict[str, float]:
        s = self.splits[split]
        return {"accuracy": majority_accuracy(self.splits["train"].targets, s.targets, s.weights)}


class PlainCE(SoftmaxCE):
    """Cross-entropy over logits divided by a fixed temperature."""

    def __init__(self, *, d_model, num_classes, rngs, temperature=1.0, ece_bins=15):
        super().__init__(d_model=d_model, num_classes=num_classes, rngs=rngs, ece_bins=ece_bins)
        self.temperature = temperature

    def __call__(self, features_XD):
        return super().__call__(features_XD) / self.temperature
