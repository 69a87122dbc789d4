"""The head group's options (attnlab.heads), checked without jax (num_classes comes from the task: checked when
the head is built)."""

from __future__ import annotations

from attnlab import checks


def classification(*, ece_bins, bias) -> None:
    """Every classification head's: the calibration error's bins, and whether its projection has a bias."""
    checks.integer("head.ece_bins", ece_bins, 1, 10**6)
    checks.boolean("head.bias", bias)


def scores_mse(*, k, M) -> None:
    checks.real("head.k", k, 0.0, 1e6, lo_open=True)  # a weight on the true class: > 0
    checks.real("head.M", M, 0.0, 1e6, lo_open=True)  # the target score of the true class


def hlgauss(*, v_min, v_max, num_bins, sigma_ratio) -> None:
    checks.real("head.v_min", v_min, -1e30, 1e30)
    if not v_min < checks.real("head.v_max", v_max, -1e30, 1e30):
        raise checks.ConfigError(f"head.v_max={v_max} is invalid; allowed: a number > head.v_min={v_min}")
    checks.integer("head.num_bins", num_bins, 2, 10**6)
    checks.real("head.sigma_ratio", sigma_ratio, 0.0, 1e6, lo_open=True)


DECLARED = {
    "attnlab.heads.HLGauss": (hlgauss,),
    "attnlab.heads.MSE": (),
    "attnlab.heads.ScoresMSE": (classification, scores_mse),
    "attnlab.heads.SoftmaxCE": (classification,),
}
