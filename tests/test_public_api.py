"""The public names: every attnlab name README.md and docs/REFERENCE.md show (as attnlab.x.y, or in a
`from attnlab.x import ...` line) imports; a module that moved keeps an alias that warns and is the moved module;
a name whose alias is gone says where it went."""

import importlib
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "REFERENCE.md"]


def shown_names() -> list[str]:
    text = "\n".join(doc.read_text() for doc in DOCS)
    dotted = set(re.findall(r"(?<![\w/.-])attnlab(?:\.[A-Za-z_]\w*)+", text))
    for module, imported in re.findall(r"from (attnlab[\w.]*) import ([\w, ]+)", text):
        dotted |= {f"{module}.{name.strip()}" for name in imported.split(",") if name.strip()}
    return sorted(dotted)


def resolve(dotted: str):
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


def test_the_docs_show_names():
    assert len(shown_names()) >= 20  # the regexes still find the documented names


@pytest.mark.parametrize("dotted", shown_names())
def test_every_name_the_docs_show_imports(dotted):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # a documented name is never a deprecated alias
        resolve(dotted)


@pytest.mark.parametrize(
    "old, new", [("attend", "attend"), ("attention_weights", "attention_weights"), ("build", "normalizer")]
)
def test_a_removed_alias_says_where_its_name_went(old, new):
    import attnlab.config
    import attnlab.normalizers

    with pytest.raises(AttributeError, match=f"attnlab.normalizers.{old} moved to attnlab.config.{new} "):
        getattr(attnlab.normalizers, old)
    assert callable(getattr(attnlab.config, new))
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        attnlab.normalizers.no_such_name  # noqa: B018


@pytest.mark.parametrize("old", sorted(__import__("attnlab.normalizers").normalizers.MOVED_MODULES))
def test_a_moved_module_keeps_its_old_name_that_warns(old):
    """`import attnlab.normalizers.impl` and `from attnlab.normalizers import impl` still work, and warn on use."""
    import attnlab.normalizers

    new = importlib.import_module(attnlab.normalizers.MOVED_MODULES[old])
    name = next(n for n in vars(new) if not n.startswith("_"))
    for module in (importlib.import_module(f"attnlab.normalizers.{old}"), getattr(attnlab.normalizers, old)):
        with pytest.warns(DeprecationWarning, match=f"attnlab.normalizers.{old} moved to {new.__name__}"):
            assert getattr(module, name) is getattr(new, name)
