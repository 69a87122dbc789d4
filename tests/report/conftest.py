"""The report tests read report.md's sentences whole: its folding at the terminal's width (write.folded, tested in
test_report.py) is switched off here, so a sentence a test looks for is on one line."""

import pytest

from attnlab.report import write


@pytest.fixture(autouse=True)
def _unfolded(monkeypatch, request):
    if "folds" not in request.node.name:
        monkeypatch.setattr(write, "WIDTH", 10**9)
