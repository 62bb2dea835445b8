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
    assert "idempotency_django.protocol.phases" in graph["idempotency_django.middleware"]
    assert "idempotency_django.protocol.problems" in graph["idempotency_django.protocol.phases"]


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    assert cycles(import_graph()) == []


# -- the layers ----------------------------------------------------------------

#: The integrations: each adapts the protocol to one kind of door or tool.
INTEGRATIONS = (
    "idempotency_django.drf",
    "idempotency_django.ninja",
    "idempotency_django.graphql",
    "idempotency_django.webhooks",
    "idempotency_django.tasks",
    "idempotency_django.admin",
    "idempotency_django.contrib",
    "idempotency_django.openapi",
    "idempotency_django.middleware",
    "idempotency_django.decorators",
    "idempotency_django.downstream",
    "idempotency_django.testing",
    "idempotency_django.purge",
    "idempotency_django.management",
)
#: The 0.2.0 paths of moved modules: re-exports that warn, imported by nobody inside.
MOVED = {
    "idempotency_django.fingerprint": "idempotency_django.protocol.fingerprint",
    "idempotency_django.scope": "idempotency_django.protocol.scope",
    "idempotency_django.problems": "idempotency_django.protocol.problems",
    "idempotency_django.phases": "idempotency_django.protocol.phases",
    "idempotency_django.encryption": "idempotency_django.stores.encryption",
    "idempotency_django.contract": "idempotency_django.stores.contract",
}


def under(name: str, *packages: str) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def imports_under(layer: str) -> dict[str, set[str]]:
    return {name: imported for name, imported in import_graph().items() if under(name, layer)}


def test_the_protocol_imports_no_integration() -> None:
    crossing = {
        name: sorted(target for target in imported if under(target, *INTEGRATIONS))
        for name, imported in imports_under("idempotency_django.protocol").items()
    }
    assert {name: targets for name, targets in crossing.items() if targets} == {}


def test_the_stores_import_neither_the_protocol_nor_an_integration() -> None:
    above = ("idempotency_django.protocol", *INTEGRATIONS)
    crossing = {
        name: sorted(target for target in imported if under(target, *above))
        for name, imported in imports_under("idempotency_django.stores").items()
    }
    assert {name: targets for name, targets in crossing.items() if targets} == {}


def test_nothing_inside_imports_a_moved_path() -> None:
    importers = {
        name: sorted(set(imported) & MOVED.keys())
        for name, imported in import_graph().items()
        if name not in MOVED
    }
    assert {name: targets for name, targets in importers.items() if targets} == {}


def test_each_moved_path_warns_and_is_the_new_module() -> None:
    import importlib
    import sys
    import warnings

    for old, new in MOVED.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
            f"{old} moved to {new}: import it from there ({old} goes in 1.0)."
        ]
        new_module = importlib.import_module(new)
        public = [name for name in vars(new_module) if not name.startswith("_")]
        assert all(getattr(module, name) is getattr(new_module, name) for name in public)


def test_every_path_the_api_reference_documents_imports() -> None:
    import importlib

    api = (PACKAGE.parent / "docs" / "api.md").read_text()
    paths = [line.split()[1] for line in api.splitlines() if line.startswith("::: ")]
    assert len(paths) > 20
    for path in paths:
        try:
            importlib.import_module(path)
        except ImportError:
            module, _, name = path.rpartition(".")
            assert hasattr(importlib.import_module(module), name), path
