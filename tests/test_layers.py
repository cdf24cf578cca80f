"""Imports run downhill: every import of every rlx module (also those inside functions) is checked
against the declared layer order below.

A unit is a folder of ``rlx/`` (``rlx/sync/...`` is ``sync``) or a top-level module (``rlx/rpc.py`` is
``rpc``). An import may go to a unit of a lower layer or stay inside its own unit. It never goes up,
and it goes sideways (to another unit of the same layer) only into that unit's declared interface
(``INTERFACES``). No cycle between units, whatever the edges' direction. A failure prints every
offending import as ``file:line``.

Left out: cycles between modules of one folder (a factory that imports its implementations lazily, and
the implementations that import the factory's base, are one such cycle by design).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

RLX = Path(__file__).resolve().parents[1] / "rlx"

LAYERS: list[set[str]] = [
    # ground, under everything: the package itself and the config schema (with the errors every layer raises)
    {"rlx", "config"},
    # ground: ZeroMQ request/reply, addresses, /dev/shm segments, placement, plugins, file formats
    {"rpc", "net", "shm", "placement", "plugins", "formats"},
    # the tracer: every process writes spans, the layers above as much as the roles
    {"trace"},
    # layers the roles stand on: weight transfer, the sample store, checkpoint conversion
    {"sync", "store", "convert"},
    # process roles: the trainer ranks, the rollout server, the agent's workers, the tasks
    {"trainer", "rollout", "agent", "tasks"},
    # rank 0's RL loop, which drives the roles
    {"orchestrator"},
    # supervision: starts every process of a run
    {"launch"},
    # the bench-sync harness, which starts its servers through the launcher's process set
    {"bench"},
    # the command line, and ``python -m rlx`` on it
    {"cli"},
    {"__main__"},
]

INTERFACES: dict[str, set[str]] = {
    # what a sibling of the same layer may import of a unit; everything else in it is internal
    "rollout": {"rlx.rollout.protocol", "rlx.rollout.client"},  # the rollout server's API (a teacher, a judge)
    "tasks": {"rlx.tasks", "rlx.tasks.base", "rlx.tasks.reward_fn"},  # build_task, Task/Problem, user rewards
}


def _layer_of(unit: str) -> int:
    for index, layer in enumerate(LAYERS):
        if unit in layer:
            return index
    raise AssertionError(f"rlx/{unit} is in no layer of tests/test_layers.py's LAYERS; add it where it belongs")


def _module_name(path: Path) -> str:
    parts = path.relative_to(RLX.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "rlx"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported rlx module) of every import in ``path``, at any depth; relative ones resolved."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found += [
                (node.lineno, f"{target}.{alias.name}" if _is_module(f"{target}.{alias.name}") else target)
                for alias in node.names
            ]
    return sorted({(line, name) for line, name in found if name == "rlx" or name.startswith("rlx.")})


def _is_module(name: str) -> bool:
    path = RLX.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _edges() -> list[tuple[str, str, str, str]]:
    """(from unit, to unit, imported module, file:line) of every import that leaves its unit."""
    edges = []
    for path in sorted(RLX.rglob("*.py")):
        source = _unit(_module_name(path))
        for line, target in _imports(path):
            if _unit(target) != source:
                edges.append((source, _unit(target), target, f"{path.relative_to(RLX.parent)}:{line}"))
    return edges


def _wrong_way(edges) -> list[str]:
    wrong = []
    for source, target, module, where in edges:
        up, down = _layer_of(target), _layer_of(source)
        if up > down:
            wrong.append(f"{where}: {module} (up: {source} -> {target})")
        elif up == down and module not in INTERFACES.get(target, set()):
            wrong.append(
                f"{where}: {module} (sideways into {target}'s internals; its interface: "
                f"{sorted(INTERFACES.get(target, set())) or 'none'})"
            )
    return wrong


def _cycles(edges) -> list[list[str]]:
    """The strongly connected groups of more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for source, target, _, _ in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_every_unit_has_a_layer():
    units = {_unit(_module_name(path)) for path in RLX.rglob("*.py")}
    for unit in sorted(units):
        _layer_of(unit)


def test_imports_run_downhill():
    wrong = _wrong_way(_edges())
    assert not wrong, f"{len(wrong)} imports run up a layer or sideways into a sibling's internals:\n" + "\n".join(
        wrong
    )


def test_no_cycle_between_folders():
    edges = _edges()
    cycles = _cycles(edges)
    # a cycle has at least one edge that does not run down a layer: those are the ones to show
    lines = [
        f"{' <-> '.join(group)}, closed by:\n"
        + "\n".join(
            f"    {where}: {module}"
            for source, target, module, where in edges
            if source in group and target in group and _layer_of(target) >= _layer_of(source)
        )
        for group in cycles
    ]
    assert not cycles, f"{len(cycles)} cycles between folders:\n" + "\n".join(lines)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from rlx.sync import messages\n", ["rlx.sync.messages"]),
        ("def f():\n    from ..rollout.protocol import Request\n", ["rlx.rollout.protocol"]),
        ("import rlx.trace\nimport os\n", ["rlx.trace"]),
    ],
)
def test_imports_are_found_at_any_depth(tmp_path, monkeypatch, source, expected):
    """The scanner itself: a function's import and a relative one are seen and resolved."""
    monkeypatch.setattr(sys.modules[__name__], "RLX", tmp_path / "rlx")
    module = tmp_path / "rlx" / "store" / "x.py"
    module.parent.mkdir(parents=True)
    module.write_text(source)
    for name in ("sync/messages.py", "rollout/protocol.py", "trace/__init__.py"):
        (tmp_path / "rlx" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "rlx" / name).touch()
    assert [name for _, name in _imports(module)] == expected
