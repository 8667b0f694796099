"""docs/ARCHITECTURE.md against the code: every file and function its token-path tables name
exists (the socket-to-event one in eight files at most), every repository path it names
exists, and every module its module map names is in that package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
TICKED = re.compile(r"`([^`]+)`")


def section(title: str) -> str:
    start = DOC.index(f"\n## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end > 0 else None]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of each Markdown table in ``text``, as lists of cells."""
    rows = [line.strip().strip("|").split("|") for line in text.splitlines()]
    return [[c.strip() for c in r] for r in rows if len(r) >= 2 and not set(r[0]) <= set(" -")]


def path_tables() -> list[list[tuple[str, list[str]]]]:
    """Each table of the token's path: its (file, functions) rows."""
    tables = []
    for block in section("One token's path").split("\n\n"):
        if block.lstrip().startswith("| step"):
            rows = table_rows(block)[1:]  # past the header
            tables.append([(TICKED.findall(r[1])[0], TICKED.findall(r[2])) for r in rows])
    return tables


def defined(path: Path) -> set[str]:
    """Top-level functions and classes, and ``Class.method`` for their methods."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return names


def test_the_token_path_names_real_files_and_functions() -> None:
    tables = path_tables()
    assert len(tables) == 2  # from umad's socket; through the gateway
    for table in tables:
        for file, functions in table:
            assert (ROOT / file).is_file(), file
            missing = set(functions) - defined(ROOT / file)
            assert functions and not missing, f"{file}: {sorted(missing)} not defined there"


def test_the_socket_to_event_path_reads_in_eight_files_at_most() -> None:
    files = {file for file, _ in path_tables()[0]}
    assert 2 <= len(files) <= 8, sorted(files)


def test_every_path_the_doc_names_exists() -> None:
    top = "core|gateway|clients|bench|uma_serve|deploy|tests|docs"
    paths = re.findall(rf"(?<![\w/.])((?:{top})/[\w./-]*)", DOC)
    assert len(paths) > 20
    missing = [p for p in paths if not (ROOT / p.rstrip(".")).exists()]
    assert not missing, missing


def test_the_module_map_names_modules_of_their_package() -> None:
    not_modules = {"llama_cpp"}  # named, not mapped
    rows = table_rows(section("Module map"))[1:]
    packages = 0
    for row in rows:
        folder = ROOT / TICKED.findall(row[0])[0]
        if not (folder / "__init__.py").is_file():
            continue  # deploy/, tests/: no modules
        packages += 1
        names = [n for n in TICKED.findall(row[1]) if n.isidentifier() and n not in not_modules]
        missing = [n for n in names if not (folder / f"{n}.py").is_file()]
        assert names and not missing, f"{folder.name}/: {missing}"
    assert packages >= 8
