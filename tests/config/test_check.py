"""`attnlab-check` (attnlab.config.check): a component built from a user's config directory and run through its
group's contract; exit 0 when it passes, 1 naming the broken property, 2 on bad input, each in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.config import check, registry

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "capped"

LEAKY = '''
import jax.numpy as jnp
from attnlab.normalizers import Softmax


class Leaky(Softmax):
    """Softmax over every key: padding keys get weight."""

    def normalize(self, z_BNTS, m_B1TS):
        return super().normalize(z_BNTS, jnp.ones_like(m_B1TS))
'''


def run(argv, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of attnlab-check ARGV in this process, the search path restored."""
    try:
        check.main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    finally:
        registry.use()
    out = capsys.readouterr()
    return code, out.out.strip(), out.err.strip()


def test_a_users_head_passes_and_a_users_leaky_normalizer_fails_naming_the_property(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    code, out, _ = run(["--config-dir", str(EXAMPLE / "configs"), "head=smoothed_ce"], capsys)
    assert (code, out) == (0, "attnlab-check: head=smoothed_ce passed its contract (attnlab.testing.check_head)")

    (tmp_path / "leaky.py").write_text(LEAKY)
    (tmp_path / "cfg" / "normalizer").mkdir(parents=True)
    yaml = (registry.CONFIG_DIR / "normalizer" / "softmax.yaml").read_text()
    (tmp_path / "cfg" / "normalizer" / "leaky.yaml").write_text(
        yaml.replace("_target_: attnlab.normalizers.Softmax", "_target_: leaky.Leaky")
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run(["--config-dir", str(tmp_path / "cfg"), "normalizer=leaky"], capsys)
    assert code == 1 and "\n" not in err, err
    assert err.startswith("attnlab-check: normalizer=leaky FAILED: normalizer=leaky: padding keys must weigh 0"), err


@pytest.mark.parametrize(
    "argv, said",
    [
        ([], "usage: attnlab-check [--config-dir DIR] {normalizer=NAME | task=NAME | head=NAME}"),
        (["normalizer=sofmax"], "normalizer=sofmax unknown (did you mean softmax?); allowed: "),
        (["task=mqr"], "task=mqr unknown (did you mean mqar?); allowed: "),
        (["task=mqar", "task._target_=os.system"], "task _target_ 'os.system' refused (a builtin_function_or_method)"),
        (["normalizer=kl", "normalizer.prio=uniform"], "normalizer.prio is not a key of the config (did you mean"),
        (["--config-dir", "nowhere", "normalizer=kl"], "--config-dir 'nowhere': no such directory"),
    ],
)
def test_bad_input_exits_2_in_one_line(argv, said, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(argv, capsys)
    assert code == 2 and "\n" not in err and err.startswith(f"attnlab-check: error: {said}"), err
