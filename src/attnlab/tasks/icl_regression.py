"""In-context linear regression (Garg et al. 2022, "What can transformers learn in-context?")."""

from __future__ import annotations

import types

import numpy as np

from attnlab.options import tasks as task_options
from attnlab.tasks.base import Split, Task, disjoint_splits, split_sizes


def context_predictions(xs: np.ndarray, ys: np.ndarray, ridge: float) -> np.ndarray:
    """Predict y_i from pairs 0..i-1 by least squares, for every i; (N,P,d),(N,P) -> (N,P).

    ridge == 0: minimum-norm least squares (the pseudo-inverse, as numpy.linalg.lstsq returns when
    fewer pairs than dimensions); ridge > 0: w = (X^T X + ridge I)^-1 X^T y. With no pairs: 0.
    """
    n, p, d = xs.shape
    preds = np.zeros((n, p))
    for i in range(1, p):
        X, y = xs[:, :i], ys[:, :i]
        if ridge > 0:
            A = np.einsum("nki,nkj->nij", X, X) + ridge * np.eye(d)
            w = np.linalg.solve(A, np.einsum("nki,nk->ni", X, y)[..., None])[..., 0]
        else:
            # Cutoff as in lstsq's default rcond (eps * max(M, N)), so near-singular contexts agree with it.
            w = np.einsum("nij,nj->ni", np.linalg.pinv(X, rtol=np.finfo(np.float64).eps * max(i, d)), y)
        preds[:, i] = np.einsum("ni,ni->n", w, xs[:, i])
    return preds


class ICLRegression(Task):
    """Sequences x1, y1, x2, y2, ... of a fresh linear function y = w.x (+ noise); predict y_i at x_i.

    Token layout (Garg et al. 2022): x-token = [x_i, 0], y-token = [0...0, y_i], so input_dim = dim+1.
    The target y_i sits at the x_i position, where a causal model has seen x_i and the earlier pairs.
    y has variance `dim` (w, x ~ N(0, I)); Garg et al. report squared error divided by `dim`.
    """

    kind = "regression"
    baseline_labels = {"mse": {"mse": "least squares in context", "mse_zero": "zero predictor"}}
    granularity = "token"
    length_option = "n_points"  # task.test_lengths sets it
    tiny_options = types.MappingProxyType({"dim": 3, "n_points": 6})

    def __init__(
        self,
        dim: int = 5,
        n_points: int = 20,
        noise_std: float = 0.0,
        ridge: float | None = None,
        seed: int = 0,
        n_train: int = 20000,
        n_val: int = 1000,
        n_test: int = 1000,
        default_head: str = "mse",
        **shared,
    ):
        super().__init__(**shared)  # the options every task takes (Task.__init__)
        task_options.icl_regression(
            dim=dim,
            n_points=n_points,
            noise_std=noise_std,
            ridge=ridge,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
        )
        self.dim, self.n_points, self.noise_std = int(dim), int(n_points), float(noise_std)
        # Default: ridge = noise_std^2, the posterior mean under the generating prior w ~ N(0, I) (Bayes optimal);
        # noiseless it is 0, i.e. minimum-norm least squares, Garg et al.'s reference.
        self.ridge = self.noise_std**2 if ridge is None else float(ridge)
        self.seq_len = 2 * self.n_points
        self.input_dim, self.vocab_size, self.num_classes = self.dim + 1, None, None
        self.default_head = default_head
        sizes = split_sizes(n_train, n_val, n_test)
        self.options = dict(
            dim=dim,
            n_points=n_points,
            noise_std=noise_std,
            ridge=ridge,
            seed=seed,
            n_train=n_train,
            n_val=n_val,
            n_test=n_test,
            default_head=default_head,
        )
        self.splits = disjoint_splits(self._sample, sizes, int(seed))

    def _sample(self, rng: np.random.Generator, n: int) -> Split:
        """Draw n prompts, each with its own weight vector."""
        d, p = self.dim, self.n_points
        w = rng.standard_normal((n, d))
        xs = rng.standard_normal((n, p, d))
        ys = np.einsum("npd,nd->np", xs, w) + self.noise_std * rng.standard_normal((n, p))
        inputs = np.zeros((n, 2 * p, d + 1), dtype=np.float32)
        inputs[:, 0::2, :d] = xs
        inputs[:, 1::2, d] = ys
        targets = np.zeros((n, 2 * p), dtype=np.float32)
        targets[:, 0::2] = ys
        weights = np.zeros((n, 2 * p), dtype=np.float32)
        weights[:, 0::2] = 1.0
        return Split(inputs, targets, weights, np.ones((n, 2 * p), dtype=bool))

    def unpack(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(xs (N,P,d), ys (N,P)) in float64, exactly as the model sees them (float32 inputs)."""
        s = self.splits[split]
        return s.inputs[:, 0::2, : self.dim].astype(np.float64), s.inputs[:, 1::2, self.dim].astype(np.float64)

    def baseline(self, split: str) -> dict[str, float]:
        """Both baselines averaged over the weighted (x) positions."""
        s = self.splits[split]
        w = s.weights[:, 0::2].astype(np.float64)
        xs, ys = self.unpack(split)
        err = (context_predictions(xs, ys, self.ridge) - ys) ** 2
        return {"mse": float((w * err).sum() / w.sum()), "mse_zero": float((w * ys**2).sum() / w.sum())}
