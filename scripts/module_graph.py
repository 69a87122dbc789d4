"""The import graph of src/attnlab, read from the code with `ast` (nothing is imported): each module's
module-level imports of attnlab modules, the cycles among them, the imports made inside functions, and the
package's picture in docs/ARCHITECTURE.md (a Mermaid block, one node per package or top-level module).

    python scripts/module_graph.py            # print the picture's Mermaid block
    python scripts/module_graph.py --check    # exit 1 when docs/ARCHITECTURE.md's block differs from the code's
    python scripts/module_graph.py --write    # rewrite that block

tests/test_imports.py runs the checks: no cycle, every in-function import allowed with its reason, the picture
up to date.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "attnlab"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN, END = "<!-- module graph: begin -->", "<!-- module graph: end -->"


def modules(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> file, for every .py of the package (a package is its __init__.py)."""
    out = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


@dataclasses.dataclass(frozen=True)
class InFunction:
    """An import statement inside a function body."""

    module: str  # where it is
    function: str  # the enclosing function's qualified name
    target: str  # what it imports (a module, or `module.name`)
    line: int


def _is_package(name: str, known: dict[str, Path]) -> bool:
    return known[name].name == "__init__.py"


def _base(module: str, node: ast.ImportFrom, known: dict[str, Path]) -> str:
    """The absolute module a `from X import ...` names (relative imports resolved against `module`)."""
    if not node.level:
        return node.module or ""
    anchor = module.split(".")
    if not _is_package(module, known):
        anchor = anchor[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def targets(module: str, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    """The attnlab modules one import statement names: `from pkg import sub` names pkg.sub where that is a module."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = _base(module, node, known)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for name in names:
        while name and name not in known:  # `import attnlab.x.y` of a name inside a module
            name = name.rpartition(".")[0]
        if name and name not in out:
            out.append(name)
    return out


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(module: str, body, known, scope: str | None, top: set[str], inner: list[InFunction]) -> None:
    """Collect imports: run at import time (scope None: module and class bodies) or inside a function."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if scope is None:
                top.update(targets(module, node, known))
            else:
                names = [a.name for a in node.names]
                if isinstance(node, ast.ImportFrom):
                    names = [f"{_base(module, node, known)}.{n}" for n in names]
                inner.extend(InFunction(module, scope, name, node.lineno) for name in names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _walk(module, node.body, known, f"{scope}.{node.name}" if scope else node.name, top, inner)
        elif isinstance(node, ast.ClassDef) and scope is None:
            _walk_class(module, node, known, top, inner)
        elif isinstance(node, ast.ClassDef):  # a class defined inside a function: its body runs with the function
            _walk(module, node.body, known, f"{scope}.{node.name}", top, inner)
        elif isinstance(node, ast.If) and scope is None and _type_checking_only(node):
            _walk(module, node.orelse, known, scope, top, inner)  # annotations only: never run
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                _walk(module, getattr(node, field, []), known, scope, top, inner)


def _walk_class(module: str, node: ast.ClassDef, known, top: set[str], inner: list[InFunction]) -> None:
    """A class body runs at import time; its methods are functions."""
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _walk(module, item.body, known, f"{node.name}.{item.name}", top, inner)
        else:
            _walk(module, [item], known, None, top, inner)


def graph(src: Path = SRC) -> tuple[dict[str, set[str]], list[InFunction]]:
    """(module -> the attnlab modules its module-level code imports, every import inside a function)."""
    known = modules(src)
    edges, inner = {}, []
    for name, path in known.items():
        top: set[str] = set()
        _walk(name, ast.parse(path.read_text(), str(path)).body, known, None, top, inner)
        edges[name] = top - {name}
    return edges, inner


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: the import cycles."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def unit(module: str) -> str:
    """The picture's node of a module: its subpackage (attnlab.train.loop -> train) or the top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def _reachable(arrows: set[tuple[str, str]], start: str, without: tuple[str, str]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        for a, b in arrows:
            if a == node and (a, b) != without and b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def mermaid(edges: dict[str, set[str]], inner: list[InFunction]) -> str:
    """The package's picture: a node per subpackage or top-level module; a solid arrow where
    module-level code imports the other, less those implied by a longer path of solid arrows (transitive
    reduction), a dotted one where only a function does. Modules that import none of the others and that none
    imports are left out."""
    known = modules()
    solid = {(unit(a), unit(b)) for a, bs in edges.items() for b in bs if unit(a) != unit(b)}
    direct = {(a, b) for a, b in solid if b not in _reachable(solid, a, without=(a, b))}
    dotted = set()
    for i in inner:
        target = i.target
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and unit(i.module) != unit(target) and (unit(i.module), unit(target)) not in solid:
            dotted.add((unit(i.module), unit(target)))
    drawn = sorted({n for arrow in solid | dotted for n in arrow})
    lines = ["```mermaid", "flowchart LR"]
    for node in drawn:
        package = _is_package(f"{PACKAGE}.{node}", known)
        lines.append(f'  {node}["{node}/"]' if package else f"  {node}")
    lines += [f"  {a} --> {b}" for a, b in sorted(direct)]
    lines += [f"  {a} -.-> {b}" for a, b in sorted(dotted)]
    lines.append("```")
    return "\n".join(lines)


def documented(doc: Path = DOC) -> str | None:
    """The Mermaid block between the markers of docs/ARCHITECTURE.md, or None."""
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/ARCHITECTURE.md's picture is stale")
    parser.add_argument("--write", action="store_true", help="rewrite the picture in docs/ARCHITECTURE.md")
    args = parser.parse_args()
    block = mermaid(*graph())
    if args.check:
        ok = documented() == block
        print("docs/ARCHITECTURE.md: module graph up to date" if ok else "stale: run scripts/module_graph.py --write")
        return 0 if ok else 1
    if args.write:
        head, rest = DOC.read_text().split(BEGIN, 1)
        DOC.write_text(f"{head}{BEGIN}\n{block}\n{END}{rest.split(END, 1)[1]}")
        return 0
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
