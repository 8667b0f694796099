"""The import directions of README.md ("Layout"), checked on the source (no import is executed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
FOLDERS = {"core": "uma_serve.core", "clients": "uma_serve.clients", "gateway": "uma_serve.gateway",
           "bench": "uma_serve.bench"}  # fmt: skip


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """The modules (and names in them) ``path`` imports, relative imports made absolute."""
    tree = ast.parse(path.read_text())
    package = ["uma_serve", *path.relative_to(root).parent.parts]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_only_runtime_imports_llama_cpp() -> None:
    importers = [
        str(path.relative_to(ROOT))
        for folder in (*FOLDERS, "uma_serve")
        for path in modules(folder)
        if any(n == "llama_cpp" or n.startswith("llama_cpp.") for n in imports(path))
    ]
    assert importers and all(path.startswith("core/runtime/") for path in importers), importers


def test_core_imports_nothing_outside_core() -> None:
    for path in modules("core"):
        outside = {n for n in imports(path) if n.startswith("uma_serve.")}
        outside -= {n for n in outside if n.startswith("uma_serve.core")}
        assert not outside, f"{path}: {outside}"


def test_policy_is_pure() -> None:
    banned = ("llama_cpp", "asyncio", "socket", "threading", "uma_serve.core.runtime",
              "uma_serve.core.engine", "uma_serve.core.server")  # fmt: skip
    for path in modules("core/policy"):
        bad = {n for n in imports(path) if n.startswith(banned)}
        assert not bad, f"{path}: {bad}"


@pytest.mark.parametrize("folder", ["clients", "gateway"])
def test_clients_and_gateway_use_only_the_protocol_from_core(folder: str) -> None:
    allowed = {"uma_serve.core", "uma_serve.core.protocol", "uma_serve.core.protocol.p"}
    allowed |= {"uma_serve.core.logfmt", "uma_serve.core.logfmt.FORMATS"}  # one log format
    if folder == "gateway":  # the core's limits, checked before a request is sent
        allowed |= {"uma_serve.core.limits"}
    if folder == "clients":  # where the socket is, and who may serve it
        allowed |= {"uma_serve.core.socket_path"}
        allowed |= {f"uma_serve.core.socket_path.{n}" for n in ("check_peer", "default_socket")}
    for path in modules(folder):
        core = {n for n in imports(path) if n.startswith("uma_serve.core")}
        assert core <= allowed, f"{path}: {core}"


def test_nothing_imports_the_gateway() -> None:
    for folder in ("core", "clients", "bench", "uma_serve"):
        for path in modules(folder):
            assert not {n for n in imports(path) if n.startswith("uma_serve.gateway")}, path


# Inside core the engine is the top: only the daemon and the socket side drive it; everything
# else (policy, prefix, spec, runtime, sampling...) is below it and never imports it. These two
# still do (issue 38: the scheduler alone is to touch a Sequence); strict, so the mark goes
# when the import does.
ENGINE_DRIVERS = {"core/daemon.py", "core/server.py"}
UPWARD_TODAY: dict[str, str] = {}  # known exceptions (none left)


def below_the_engine() -> list[object]:
    cases = []
    for path in modules("core"):
        rel = str(path.relative_to(ROOT))
        if rel.startswith("core/engine/") or rel in ENGINE_DRIVERS:
            continue
        why = UPWARD_TODAY.get(rel)
        marks = [pytest.mark.xfail(strict=True, reason=f"imports {why}")] if why else []
        cases.append(pytest.param(rel, marks=marks, id=rel))
    return cases


@pytest.mark.parametrize("rel", below_the_engine())
def test_nothing_below_the_engine_imports_it(rel: str) -> None:
    upward = sorted(n for n in imports(ROOT / rel) if n.startswith("uma_serve.core.engine"))
    assert not upward, f"{rel} imports upwards: {upward}"


def test_the_layering_rules_see_relative_imports(tmp_path: Path) -> None:
    """``from ..engine import x`` in core/prefix is the same import as the absolute one."""
    module = tmp_path / "core" / "prefix" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text("from ..engine.sequence import Sequence\nfrom . import index\n")
    found = imports(module, tmp_path)
    assert {"uma_serve.core.engine.sequence.Sequence", "uma_serve.core.prefix.index"} <= found
