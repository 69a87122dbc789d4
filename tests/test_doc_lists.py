"""The docs' lists of normalizers and statistics are the registries' (scripts/doc_lists.py draws them)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import doc_lists  # noqa: E402


def test_every_doc_list_is_drawn_from_the_code():
    assert doc_lists.stale() == [], "run: python scripts/doc_lists.py --write"


def test_a_list_that_lost_a_row_or_its_markers_is_stale(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    drawn = doc_lists.normalizers()
    monkeypatch.setattr(doc_lists, "ROOT", tmp_path)
    monkeypatch.setattr(doc_lists, "LISTS", {"normalizers": (readme, doc_lists.normalizers)})
    block = "<!-- doc list normalizers: begin -->\n{}\n<!-- doc list normalizers: end -->\n"
    readme.write_text(block.format(drawn))
    assert doc_lists.stale() == []
    readme.write_text(block.format("\n".join(line for line in drawn.splitlines() if "`softpick`" not in line)))
    assert doc_lists.stale() == ["README.md: doc list normalizers"]
    readme.write_text(drawn)
    assert doc_lists.stale() == ["README.md: doc list normalizers"]
