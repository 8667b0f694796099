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
