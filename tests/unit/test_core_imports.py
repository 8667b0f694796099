"""The core's own import directions, checked on the source (no import is executed): the
engine uses the prefix cache, speculation and the policy, never the other way round."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
CORE = ROOT / "core"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "uma_serve." + ".".join(parts)


def imported(path: Path) -> set[str]:
    """Every module an import in ``path`` names (TYPE_CHECKING ones included), and for a
    ``from m import x`` also ``m.x`` (x may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("package", ["prefix", "spec", "policy"])
def test_no_upward_import_of_the_engine(package: str) -> None:
    for path in sorted((CORE / package).rglob("*.py")):
        up = {n for n in imported(path) if n.startswith("uma_serve.core.engine")}
        assert not up, f"{path.relative_to(ROOT)} imports {sorted(up)}"


def import_graph() -> dict[str, set[str]]:
    """Each core module and the core modules it imports."""
    modules = {module_name(p): p for p in CORE.rglob("*.py")}
    return {name: (imported(path) & modules.keys()) - {name} for name, path in modules.items()}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` as the modules along it ([]: none)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        state[name] = 2
        path.pop()
        return []

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return []


def test_no_import_cycle_in_the_core() -> None:
    """Not even through an import only type checkers see: a cycle is a contract that knows
    its users (the policy's state once knew the latency guard's)."""
    assert cycle(import_graph()) == []


def test_the_cycle_check_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycle(graph) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []
