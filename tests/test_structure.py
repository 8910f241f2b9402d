"""The package's shape, held by reading its source with `ast` (nothing is imported):

- imports point down the layers README's Development section draws (cli, the commands' packages, the shared
  modules, bindings, errors), and the import graph between ccbridge modules has no cycle. Every import
  counts, at module level and inside functions; `from pkg import name` counts as importing pkg.name where that
  is a module, else pkg (its __init__); relative imports are resolved; `import ccbridge` and
  `from ccbridge import __version__` are imports of the package's __init__;
- no module reaches another module's private name (a leading underscore, not a dunder): not by import
  (`from m import _x`, `from pkg import _mod`, `import pkg._mod`) and not by attribute (`mod._x` where mod
  names an imported ccbridge module);
- every import sits at module level, except an import of a heavy optional dependency (torch, transformers, ...)
  deferred into the function that needs it, which says so: a comment with "deferred" (and which dependency) on
  its line or on the comment and import lines just above it;
- no module is over 600 lines, and no function over 100.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = SRC / "ccbridge"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


MODULES = sources()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def base_of(module: str, node: ast.ImportFrom) -> str:
    """The absolute module a `from X import ...` names (relative levels resolved against `module`)."""
    if not node.level:
        return node.module or ""
    package = module.split(".")
    if MODULES[module].name != "__init__.py":
        package.pop()  # a plain module's level 1 is its package
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


class Imports(ast.NodeVisitor):
    """The ccbridge modules one module imports, the names it binds to them, and the private names it reaches."""

    def __init__(self, module: str):
        self.module = module
        self.edges: dict[str, int] = {}  # imported module -> first line
        self.bound: dict[str, str] = {}  # local name -> ccbridge module (for attribute reach-ins)
        self.private: list[str] = []

    def _edge(self, target: str, line: int) -> None:
        if target != self.module:
            self.edges.setdefault(target, line)

    def _where(self, node: ast.AST) -> str:
        return f"{MODULES[self.module].relative_to(SRC)}:{node.lineno}"

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] != "ccbridge":
                continue
            for part in alias.name.split(".")[1:]:
                if is_private(part):
                    self.private.append(f"{self._where(node)}: import {alias.name}")
            self._edge(alias.name, node.lineno)
            if alias.asname:
                self.bound[alias.asname] = alias.name
            else:
                self.bound["ccbridge"] = "ccbridge"

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = base_of(self.module, node)
        if base.split(".")[0] != "ccbridge":
            return
        for part in base.split(".")[1:]:
            if is_private(part):
                self.private.append(f"{self._where(node)}: from {base} import ...")
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if full in MODULES:
                self._edge(full, node.lineno)
                self.bound[alias.asname or alias.name] = full
            else:
                self._edge(base, node.lineno)
            if is_private(alias.name):
                self.private.append(f"{self._where(node)}: from {base} import {alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain, inner = [node.attr], node.value
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner = inner.value
        if isinstance(inner, ast.Name) and inner.id in self.bound:
            # walk `ccbridge.probe.registry._x` down through the modules it names to the first non-module
            target = self.bound[inner.id]
            for attr in reversed(chain):
                if f"{target}.{attr}" in MODULES and not is_private(attr):
                    target = f"{target}.{attr}"
                    continue
                if is_private(attr) and target != self.module:
                    self.private.append(f"{self._where(node)}: {ast.unparse(node)} ({target}.{attr})")
                break
        self.visit(inner)  # not the chain's inner links: each reach-in is named once, at its whole chain


def scan(name: str, tree: ast.Module) -> Imports:
    found = Imports(name)
    # bindings first (an import below a use in the file still binds the name for the function that uses it)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.visit(node)
    found.private.clear()
    found.visit(tree)
    return found


SCANS = {name: scan(name, tree) for name, tree in TREES.items()}


def cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """The strongly connected components of more than one module (Tarjan): each as one cycle through its first
    module and all its modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[tuple[list[str], list[str]]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append((one_cycle(graph, set(comp)), sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def one_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first back to it)."""
    start = min(comp)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def import_graph() -> dict[str, set[str]]:
    return {name: {t for t in scan.edges if t in MODULES} for name, scan in SCANS.items()}


def test_the_scan_sees_the_package():
    graph = import_graph()
    assert "ccbridge.cli" in graph and "ccbridge.serve.decode" in graph
    assert "ccbridge.errors" in graph["ccbridge.cli"]
    assert "ccbridge.serve.stepper" in graph["ccbridge.serve.decode"]  # an import inside a package


# The layers of README's Development section, top first: an import may point down or within a layer, never up.
COMMANDS = {"probe", "emulate", "serve", "secure", "load", "report", "advise", "advise_mgpu", "account",
            "account_ranks", "compare", "attest", "tenants"}
ENTRY_POINTS = {"ccbridge": "ccbridge.load", "ccbridge.__main__": "ccbridge.cli"}  # the lazy facade, `python -m`


def layer(module: str) -> int:
    part = (module.split(".") + [""])[1]
    if part == "cli":
        return 0
    if part in COMMANDS:
        return 1
    if part == "bindings":
        return 3
    return 4 if part == "errors" else 2  # the shared modules; errors below everything


def test_imports_point_down_the_layers():
    up = [f"{a} -> {b}" for a, targets in sorted(import_graph().items()) for b in sorted(targets)
          if layer(b) < layer(a) and ENTRY_POINTS.get(a) != b]
    assert not up, "imports that point up the layers (cli, commands, shared, bindings, errors):\n" + "\n".join(up)


def cycle_findings() -> list[str]:
    """Each cycle, named, with all the modules entangled in it."""
    return [f"{' -> '.join(c)}\n  (all entangled: {', '.join(comp)})" for c, comp in cycles(import_graph())]


def private_findings() -> list[str]:
    return [hit for scan in SCANS.values() for hit in scan.private]


def function_imports(name: str) -> list:
    """The import statements inside the functions (and methods) of a module, each once."""
    found = {}
    for fn in ast.walk(TREES[name]):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found[(node.lineno, node.col_offset)] = node
    return [found[k] for k in sorted(found)]


def undeferred_imports(name: str) -> list[str]:
    """The imports inside functions of a module whose line, or the run of comment and import lines just above
    it, carries no comment saying `deferred`."""
    lines = MODULES[name].read_text().splitlines()
    nested = function_imports(name)
    import_lines = {n for node in nested for n in range(node.lineno, node.end_lineno + 1)}
    bare = []
    for node in nested:
        first = node.lineno
        while first - 1 in import_lines or lines[first - 2].strip().startswith("#"):
            first -= 1
        said = [lines[n - 1].partition("#")[2] for n in range(first, node.end_lineno + 1)]
        if not any("deferred" in comment for comment in said):
            bare.append(f"{MODULES[name].relative_to(SRC)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return bare


def import_findings() -> list[str]:
    return [hit for name in MODULES for hit in undeferred_imports(name)]


def test_no_import_cycles():
    found = cycle_findings()
    assert not found, "import cycles:\n" + "\n".join(found)


def test_no_private_names_across_modules():
    found = private_findings()
    assert not found, "private names reached from another module:\n" + "\n".join(found)


def test_imports_are_at_module_level_unless_deferred_with_a_reason():
    found = import_findings()
    assert not found, ("imports inside functions without a `# deferred: <dependency>` comment (move them to the "
                       "module's top):\n" + "\n".join(found))


def test_module_and_function_sizes():
    over = []
    for name, path in MODULES.items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            over.append(f"{path.relative_to(SRC)}: {lines} lines (module limit {MAX_MODULE_LINES})")
        for node in ast.walk(TREES[name]):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    over.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.name} is {n} lines "
                                f"(function limit {MAX_FUNCTION_LINES})")
    assert not over, "too long:\n" + "\n".join(over)


# the checker's own behaviour, on sources made up here
@pytest.mark.parametrize("graph, expect", [
    ({"a": {"b"}, "b": {"a"}}, [(["a", "b", "a"], ["a", "b"])]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b", "c"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}, [(["a", "c", "a"], ["a", "b", "c"])]),
])
def test_cycle_finder(graph, expect):
    assert cycles(graph) == expect


def test_the_scan_finds_imports_and_private_reach_ins(monkeypatch):
    files = ("__init__.py", "a.py", "b.py", "pkg/__init__.py", "pkg/m.py")
    fake = {module_name(SRC / "ccbridge" / f): SRC / "ccbridge" / f for f in files}
    monkeypatch.setitem(globals(), "MODULES", fake)
    code = """
from ccbridge.b import _x, y
from . import b
from ccbridge import __version__
from .pkg import _hidden_module


def f():
    import ccbridge.pkg.m as m
    from ccbridge.pkg import m as same
    return b._hidden, m.public, same._p, b.__doc__, ccbridge_local._fine
"""
    found = scan("ccbridge.a", ast.parse(code))
    assert set(found.edges) == {"ccbridge.b", "ccbridge", "ccbridge.pkg", "ccbridge.pkg.m"}
    hits = "\n".join(found.private)
    assert "import _x" in hits and "b._hidden" in hits and "same._p" in hits and "_hidden_module" in hits
    assert "__version__" not in hits and "__doc__" not in hits and "_fine" not in hits and len(found.private) == 4

