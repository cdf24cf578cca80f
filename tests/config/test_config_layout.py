"""The config package stays readable: one module a section, none over 300 lines, and no import cycle between its
modules (the ones a module needs only for annotations, under ``TYPE_CHECKING``, are left out: they never run)."""

import ast
from pathlib import Path

CONFIG = Path(__file__).parents[2] / "rlx" / "config"
MAX_LINES = 300


def _runtime_imports(path: Path) -> set[str]:
    """The ``rlx.config`` modules ``path`` imports when it runs, at any depth, outside ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("rlx.config"):
                found.add(child.module.removeprefix("rlx.config").lstrip(".") or "__init__")
            elif isinstance(child, ast.Import):
                found.update(
                    a.name.removeprefix("rlx.config").lstrip(".") or "__init__"
                    for a in child.names
                    if a.name.startswith("rlx.config")
                )
            visit(child)

    visit(ast.parse(path.read_text()))
    return found - {path.stem}


def _cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph, as the modules along it; empty when there is none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_no_config_module_is_over_300_lines():
    long = {p.name: n for p in CONFIG.glob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these config modules (lines): {long}"


def test_no_import_cycle_in_config():
    edges = {p.stem: _runtime_imports(p) for p in CONFIG.glob("*.py")}
    # the package's __init__ imports its modules; a module importing ``rlx.config`` itself closes a cycle
    assert not (found := _cycle(edges)), "import cycle in rlx/config: " + " -> ".join(found)


def test_the_cycle_finder_finds_one(tmp_path):
    (tmp_path / "a.py").write_text("from rlx.config.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from rlx.config.a import y\n")
    (tmp_path / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlx.config.a import z\n"
    )
    edges = {p.stem: _runtime_imports(p) for p in tmp_path.glob("*.py")}
    assert edges["c"] == set()
    assert _cycle(edges) == ["a", "b", "a"]
