"""The package's modules import each other without a cycle, not even a lazy one.

A cycle hidden in a function-level import still ties the modules together:
neither can be read, tested or replaced without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import idempotency_django

PACKAGE = Path(idempotency_django.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in modules}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]
    modules = {module_name(path) for path in paths}
    graph = {module_name(path): imports_of(path, modules) for path in paths}
    # A module's parent package is imported before it: not a dependency of its own.
    for name, imported in graph.items():
        imported.discard(name)
        imported -= {parent for parent in modules if name.startswith(parent + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    path: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> None:
        if node in path:
            found.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        path.append(node)
        for target in sorted(graph.get(node, ())):
            visit(target)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)
    return found


def test_the_graph_is_read_from_the_sources() -> None:
    graph = import_graph()
    assert "idempotency_django.phases" in graph["idempotency_django.middleware"]
    assert "idempotency_django.problems" in graph["idempotency_django.phases"]


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    assert cycles(import_graph()) == []
