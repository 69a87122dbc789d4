"""The host float64 temperature scaling attnlab used before issue 25, kept as the test reference.

scipy's bounded Brent minimiser on log T of the weighted NLL (numpy float64), then test-split ECE, NLL and
accuracy before and after; `n_bins` for both ECE values.
"""

import numpy as np
import scipy.optimize

from attnlab import calibration as cal


def _float64(logits, labels, weights):
    return np.asarray(logits, np.float64), np.asarray(labels), np.asarray(weights, np.float64)


def fit_temperature(logits_NC, labels_N, weights_N) -> float:
    z_NC, y_N, w_N = _float64(logits_NC, labels_N, weights_N)

    def objective(log_t: float) -> float:
        return float(cal.nll(z_NC / np.exp(log_t), y_N, w_N))

    res = scipy.optimize.minimize_scalar(objective, bounds=(np.log(1e-2), np.log(1e2)), method="bounded",
                                         options={"xatol": 1e-7, "maxiter": 500})
    if not res.success or res.fun > objective(0.0):
        return 1.0
    return float(np.exp(res.x))


def temperature_report(val_logits, val_labels, val_w, test_logits, test_labels, test_w, n_bins=15):
    t = fit_temperature(val_logits, val_labels, val_w)
    z_NC, y_N, w_N = _float64(test_logits, test_labels, test_w)
    report = {"temperature": t}
    for suffix, logits_NC in (("", z_NC), ("_ts", z_NC / t)):
        report["ece" + suffix] = float(cal.ece(cal.softmax(logits_NC), y_N, w_N, n_bins))
        report["nll" + suffix] = float(cal.nll(logits_NC, y_N, w_N))
        report["accuracy" + suffix] = float(cal.accuracy(logits_NC, y_N, w_N))
    return report
