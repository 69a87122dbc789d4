"""The import structure of src/attnlab, read from the code (scripts/module_graph.py, `ast`): no cycle between modules,
every import inside a function listed with its reason, and docs/ARCHITECTURE.md's picture drawn from the code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import module_graph as mg  # noqa: E402

# Why an import is made inside a function rather than at the top of its module. Import costs are the CPU time of
# `python -c 'import X'` less an empty interpreter's, median of 5 fresh processes (2-core machine).
JAX_OUT_OF_THE_CLI = (
    "attnlab-train answers --help and refuses a bad command before jax and flax load: `import attnlab.cli` "
    "takes 0.99 s CPU, 1.95 s after `import jax, flax.nnx` (median of 7 paired runs)"
)
TENSORBOARD = "tensorboard's protobufs (import attnlab.board.hparams: 0.22 s CPU) load once a run declares its HParams"
REPORT_OUT_OF_TRAINING = "the console script attnlab-report is cli.report_main; attnlab-train never loads the report"
HYDRA_OUT_OF_THE_LIBRARY = (
    "Hydra (0.14 s CPU) loads where configs are composed (attnlab.config) or a sweep's overrides parsed, not when "
    "the components are used without it (normalizers, heads, tasks, train.fit) nor for attnlab-report --help"
)
CHECKER = "attnlab-check loads the contract checks (attnlab.testing, jax) once its command line is accepted"
COMPONENTS = (
    "attnlab.config's by-name builders load jax with the components they build (PEP 562): the command line's "
    "refusals use attnlab.config without it"
)
SCIPY = (
    "scipy.stats (0.76 s CPU) loads when a statistic needs it: attnlab-report --help answers without it, and "
    "attnlab-train refuses a bad command without it"
)
SKLEARN = "scikit-learn (1.75 s CPU) loads when task=digits reads its data: no other task or command pays for it"
MATPLOTLIB = "matplotlib (0.44 s CPU) loads when a figure is drawn"
EVENT_FILES = (
    "tensorboard's event reader (0.21 s CPU) loads when a report draws curves (not for --curves with no tag) or a "
    "finished run reads its val curve for its record, never for a refusal"
)
OPTIONAL = "an optional path's library: loaded only by the runs that take that path"
NO_REASON = "none found: no cycle and no start-up cost; it can move to the top of its module"

ALLOWED = {
    ("attnlab.cli", "jax"): JAX_OUT_OF_THE_CLI,
    ("attnlab.cli", "flax"): JAX_OUT_OF_THE_CLI,
    ("attnlab.cli", "attnlab.accelerator"): JAX_OUT_OF_THE_CLI,
    ("attnlab.config.assembly", "jax"): JAX_OUT_OF_THE_CLI,
    ("attnlab.config.assembly", "flax"): JAX_OUT_OF_THE_CLI,
    ("attnlab.config.assembly", "attnlab.accelerator"): JAX_OUT_OF_THE_CLI,
    ("attnlab.config.assembly", "attnlab.normalizers"): JAX_OUT_OF_THE_CLI,
    ("attnlab.config.assembly", "attnlab.model"): JAX_OUT_OF_THE_CLI,
    ("attnlab.config.assembly", "attnlab.tasks.lengths"): JAX_OUT_OF_THE_CLI,
    ("attnlab.config.assembly", "attnlab.config.components"): JAX_OUT_OF_THE_CLI,
    ("attnlab.cli", "attnlab.train"): JAX_OUT_OF_THE_CLI,
    ("attnlab.run.files", "attnlab.steps"): JAX_OUT_OF_THE_CLI,  # run.files is imported by attnlab.cli
    ("attnlab.run.record", "jax"): JAX_OUT_OF_THE_CLI,
    ("attnlab.cli", "attnlab.board.hparams"): TENSORBOARD,
    ("attnlab.run.files", "attnlab.board.hparams"): TENSORBOARD,
    ("attnlab.cli", "attnlab.report.cli"): REPORT_OUT_OF_TRAINING,
    ("attnlab.cli", "attnlab.config.check"): CHECKER,
    ("attnlab.config.check", "attnlab.normalizers.contract"): CHECKER,
    ("attnlab.config.check", "attnlab.testing"): CHECKER,
    ("attnlab.config", "attnlab.config.components"): COMPONENTS,
    ("attnlab.sweep.definition", "hydra"): HYDRA_OUT_OF_THE_LIBRARY,
    ("attnlab.report.expected", "hydra"): HYDRA_OUT_OF_THE_LIBRARY,
    ("attnlab.progress", "hydra"): HYDRA_OUT_OF_THE_LIBRARY,
    ("attnlab.run.chance", "scipy"): SCIPY,
    ("attnlab.report.stats", "scipy"): SCIPY,
    ("attnlab.tasks.digits", "sklearn"): SKLEARN,
    ("attnlab.report.lengths", "matplotlib"): MATPLOTLIB,
    ("attnlab.report.plots", "matplotlib"): MATPLOTLIB,
    ("attnlab.board.images", "matplotlib"): MATPLOTLIB,
    ("attnlab.run.events", "tensorboard"): EVENT_FILES,
    ("attnlab.tasks.lm.corpus", "datasets"): OPTIONAL + " (task.corpus from the Hugging Face hub; 0.68 s CPU)",
    ("attnlab.tasks.lm.host_stream", "grain"): OPTIONAL + " (a text over task.device_text_bytes; 0.76 s CPU)",
}


@pytest.fixture(scope="module")
def graph():
    return mg.graph()


def _key(inner: mg.InFunction, known) -> tuple[str, str]:
    """(module, what it imports): an attnlab module, or the top-level name of another package."""
    target = inner.target
    if target.split(".")[0] != mg.PACKAGE:
        return inner.module, target.split(".")[0]
    while target not in known:
        target = target.rpartition(".")[0]
    return inner.module, target


def test_the_graph_reads_imports_as_python_resolves_them(graph):
    """A positive control: relative, package and `from pkg import submodule` imports become edges."""
    edges, _ = graph
    assert "attnlab.backends.blockwise" in edges["attnlab.backends.impl"]  # from .blockwise import BlockForm
    assert "attnlab.config.assembly" in edges["attnlab.cli"]  # from attnlab.config import assembly
    assert "attnlab.report.stats" in edges["attnlab.report.cells"]  # from attnlab.report import stats
    assert mg.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_modules(graph):
    """Module-level imports form no cycle (A imports B imports A), so any module can be imported first."""
    edges, _ = graph
    assert mg.cycles(edges) == []


def test_every_import_inside_a_function_is_allowed_with_its_reason(graph):
    _, inner = graph
    known = mg.modules()
    found = {_key(i, known) for i in inner}
    unlisted = sorted(
        f"{i.module}:{i.line} ({i.function}) imports {i.target}" for i in inner if _key(i, known) not in ALLOWED
    )
    assert not unlisted, "imports inside functions with no reason in tests/test_imports.py ALLOWED:\n" + "\n".join(
        unlisted
    )
    assert not set(ALLOWED) - found, f"ALLOWED lists imports the code no longer makes: {sorted(set(ALLOWED) - found)}"


def test_no_import_inside_a_function_hides_a_cycle(graph):
    """The module-level graph plus every in-function import of an attnlab module has no cycle either."""
    edges, inner = graph
    known = mg.modules()
    full = {m: set(targets) for m, targets in edges.items()}
    for i in inner:
        module, target = _key(i, known)
        if target in known and target != module:
            full[module].add(target)
    assert mg.cycles(full) == []


def test_the_architecture_picture_is_drawn_from_the_code(graph):
    """docs/ARCHITECTURE.md's module graph is what scripts/module_graph.py draws now (--write redraws it)."""
    assert mg.documented() == mg.mermaid(*graph), "stale picture: python scripts/module_graph.py --write"


def test_the_training_loop_loads_neither_the_config_layer_nor_hydra():
    """attnlab.train is used without configs (a script that builds its own components): importing it loads neither
    attnlab.config nor Hydra (HYDRA_OUT_OF_THE_LIBRARY)."""
    import subprocess

    code = (
        "import sys, attnlab.train; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'hydra' or m.startswith('attnlab.config')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_every_attnlab_name_the_studies_and_scripts_import_exists():
    """experiments/ and scripts/ run only when a study is made again: a name they import from attnlab (at the top or
    inside a function) that the library no longer has would break the study's next run, not this suite's."""
    import ast
    import importlib

    root = Path(__file__).resolve().parents[1]
    missing = []
    for path in sorted([*(root / "experiments").rglob("*.py"), *(root / "scripts").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "attnlab":
                module = importlib.import_module(node.module)
                missing += [
                    f"{path.relative_to(root)}:{node.lineno}: {node.module}.{alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name) and not _is_module(f"{node.module}.{alias.name}")
                ]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "attnlab" and not _is_module(alias.name):
                        missing.append(f"{path.relative_to(root)}:{node.lineno}: {alias.name}")
    assert missing == []


def _is_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
