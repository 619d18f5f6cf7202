"""The modules of ``arbench/`` and ``sweeps/`` import each other without circles.

Every import counts, wherever it sits: at the top, inside a function, under
``TYPE_CHECKING``. An import placed inside a function to break a circle is still an edge
here, so the circle shows. Function-level imports in ``sweeps/`` keep a heavy library
(torch, Lightning, matplotlib) out of the CLI's start-up, and each says so in a comment
containing ``here:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("arbench", "sweeps")


def module_name(path: Path, root: Path = ROOT) -> str:
    """``arbench/approx/study.py`` -> ``arbench.approx.study``; a package's ``__init__.py``
    -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(root: Path = ROOT) -> dict[str, Path]:
    """Every module of :data:`PACKAGES` under ``root`` by name."""
    return {module_name(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}


def imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             known: set[str]) -> list[str]:
    """The modules of ``known`` that ``node`` (in ``module``) imports."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join([*package, *([base] if base else [])])
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                 for a in node.names]
    out = []
    for name in names:
        while name and name not in known:  # ``import a.b.c`` of a name that is no module
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def with_packages(target: str, importer: str) -> list[str]:
    """``target`` and the packages above it that importing it runs: those the importer is
    not inside of (inside, the package is already being imported)."""
    parts = target.split(".")
    out = [target]
    for i in range(1, len(parts)):
        package = ".".join(parts[:i])
        if not (importer == package or importer.startswith(package + ".")):
            out.append(package)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``{module: modules it imports}`` over :data:`PACKAGES`, function-level imports too."""
    files = sources(root)
    known = set(files)
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in imported(node, name, path.name == "__init__.py", known):
                    graph[name].update(t for t in with_packages(target, name) if t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_no_import_circles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_a_circle_is_found_wherever_its_import_sits(tmp_path):
    for pkg, files in {"arbench": {"__init__.py": "", "a.py": "import arbench.b\n",
                                   "b.py": "def f():\n    from arbench import c\n"},
                       "sweeps": {"__init__.py": "",
                                  "c.py": "from typing import TYPE_CHECKING\n"
                                          "if TYPE_CHECKING:\n    from arbench.a import x\n"}
                       }.items():
        (tmp_path / pkg).mkdir()
        for name, text in files.items():
            (tmp_path / pkg / name).write_text(text)
    (tmp_path / "arbench" / "c.py").write_text("from . import a\n")
    assert find_cycle(import_graph(tmp_path)) == ["arbench.a", "arbench.b", "arbench.c",
                                                  "arbench.a"]
    (tmp_path / "arbench" / "c.py").write_text("from sweeps import c\n")
    assert find_cycle(import_graph(tmp_path)) == ["arbench.a", "arbench.b", "arbench.c",
                                                  "sweeps.c", "arbench.a"]


def test_a_sub_package_is_imported_with_its_package(tmp_path):
    """Importing ``p.q.r`` runs ``p/q/__init__.py`` too: a circle through it counts, while
    a module of the package importing its sibling does not make one."""
    (tmp_path / "sweeps" / "report").mkdir(parents=True)
    (tmp_path / "arbench").mkdir()
    (tmp_path / "sweeps" / "__init__.py").write_text("")
    (tmp_path / "sweeps" / "report" / "__init__.py").write_text("from sweeps.report import t\n")
    (tmp_path / "sweeps" / "report" / "t.py").write_text("from sweeps.report.u import x\n")
    (tmp_path / "sweeps" / "report" / "u.py").write_text("x = 1\n")
    assert find_cycle(import_graph(tmp_path)) is None
    (tmp_path / "sweeps" / "h.py").write_text("from sweeps.report.u import x\n")
    (tmp_path / "sweeps" / "report" / "u.py").write_text("import sweeps.h\n")
    (tmp_path / "sweeps" / "report" / "t.py").write_text("import sweeps.h\n")
    assert find_cycle(import_graph(tmp_path)) is not None


def function_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, source line)`` of the first import inside each function of ``path``."""
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for fn in ast.walk(ast.parse(text)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own = [node.lineno for node in ast.walk(fn)
                   if isinstance(node, (ast.Import, ast.ImportFrom))]
            if own:
                out.append((min(own), lines[min(own) - 1]))
    return sorted(set(out))


@pytest.mark.parametrize("path", sorted((ROOT / "sweeps").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_sweeps_function_imports_say_why(path):
    """A function of ``sweeps/`` that imports says why (``here:`` in a comment on its first
    import or the line above): to keep a heavy library out of the CLI's start-up, never to
    dodge a circle, which :func:`test_no_import_circles` would find anyway."""
    lines = path.read_text().splitlines()
    unexplained = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
                   for n, line in function_imports(path)
                   if "here:" not in line and "here:" not in lines[n - 2]]
    assert not unexplained, "\n".join(unexplained)
