"""experiments/length_dispersion/init_curves.py: its closed forms against attnlab's own normalizers and the numbers
Nakanishi (2025) quotes for softmax."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "length_dispersion" / "init_curves.py"


def load():
    spec = importlib.util.spec_from_file_location("init_curves", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ic = load()


@pytest.mark.parametrize("name", list(ic.NORMALIZERS))
@pytest.mark.parametrize("n", [2, 10, 100, 1000])
def test_closed_forms_match_the_library_normalizers(name, n):
    want = ic.closed_form(name, n)
    got = ic.library_weights(name, n)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_softmax_disperses_as_nakanishi_quotes_and_ssmax_does_not():
    assert round(ic.softmax_max(10), 2) == 0.94 and round(ic.softmax_max(1000), 2) == 0.13  # the paper's Figure 1
    for n in (10, 1000):
        assert ic.closed_form("softmax", n).max() == pytest.approx(ic.softmax_max(n), rel=1e-12)
        s = ic.SSMAX_S * np.log(n)
        assert ic.closed_form("ssmax (s = 0.43)", n).max() == pytest.approx(ic.softmax_max(n, s), rel=1e-12)
    assert ic.closed_form("ssmax (s = 0.43)", 10000).max() > 0.999  # 1 / (1 + (n − 1) n^{−5s}) → 1 for 5s > 1


def test_entropy_is_normalised_by_log_n():
    assert ic.entropy_normalised(np.ones(7)) == pytest.approx(1.0)
    assert ic.entropy_normalised(np.array([1.0, 0.0, 0.0])) == 0.0
    w = np.array([0.5, 0.25, 0.25])
    assert ic.entropy_normalised(2 * w) == pytest.approx(-(w * np.log(w)).sum() / np.log(3))  # rows renormalised


def test_query_rows_reads_the_weighted_row_over_its_causal_keys():
    spec = importlib.util.spec_from_file_location("query_rows", SCRIPT.parent / "query_rows.py")
    qr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(qr)
    rng = np.random.default_rng(0)
    maps = np.tril(rng.uniform(0.1, 1.0, (2, 5, 5)))  # causal rows; not normalised (sigmoid-like mass)
    weights = np.zeros((2, 5))
    weights[0, 2] = weights[1, 4] = 1.0
    max_w, ent = qr.query_row_stats(maps, weights)
    for b, q in ((0, 2), (1, 4)):
        row = maps[b, q, : q + 1]
        p = row / row.sum()
        assert max_w[b] == pytest.approx(row.max()) and ent[b] == pytest.approx(-(p * np.log(p)).sum() / np.log(q + 1))
