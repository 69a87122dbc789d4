"""A float64 host reference for temperature scaling: scipy's bounded Brent minimiser on log T of the weighted
NLL (numpy float64), which calibration.fit_temperature (on device) is pinned to."""

import numpy as np
import scipy.optimize

from attnlab.heads import calibration as cal


def _float64(logits, labels, weights):
    return np.asarray(logits, np.float64), np.asarray(labels), np.asarray(weights, np.float64)


def fit_temperature(logits_NC, labels_N, weights_N) -> float:
    z_NC, y_N, w_N = _float64(logits_NC, labels_N, weights_N)

    def objective(log_t: float) -> float:
        return float(cal.nll(z_NC / np.exp(log_t), y_N, w_N))

    res = scipy.optimize.minimize_scalar(
        objective, bounds=(np.log(1e-2), np.log(1e2)), method="bounded", options={"xatol": 1e-7, "maxiter": 500}
    )
    if not res.success or res.fun > objective(0.0):
        return 1.0
    return float(np.exp(res.x))
