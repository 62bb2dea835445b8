"""Sybil runs the documentation's Python blocks from the Markdown (docs/contributing.md).

A pytest plugin loaded inside the fresh ``startproject`` that tests/test_quickstart.py
builds from docs/quickstart.md (``-p tests.docs_blocks``, DJANGO_SETTINGS_MODULE
``mysite.settings``): the blocks run against the quickstart's own models, in the
project a reader has after the quickstart.

* A block titled ``…settings.py`` is lines added to settings: it runs in a namespace
  seeded with the project's settings (``INSTALLED_APPS += [...]`` works), and every
  ``IDEMPOTENCY`` key it sets must be a setting; its values pass the system checks.
* Any other block, titled with the file it belongs in (``bookings/api.py``) or not, runs
  in the page's namespace as a module of the ``bookings`` app (relative imports work),
  one namespace per page, in page order; ``<!-- invisible-code-block: python -->``
  comments exercise what a block defines. The walkthrough of docs/quickstart.md writes
  its own files, so Sybil skips that part (``<!-- skip: start -->``); a block that needs
  what the project lacks (the example project's model) is ``<!-- skip: next -->`` under
  a comment that says why, and a test checks it against the file that runs.
* Tests of behaviour run a page's own code with ``run_page_code()``.

A block that is not Python of a known form fails: a fence ``python`` that Sybil did not
understand would otherwise be skipped in silence.
"""

from __future__ import annotations

import copy
import re
import textwrap
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from sybil import Example, Sybil
from sybil.evaluators.python import pad
from sybil.parsers.markdown import SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, RawFencedCodeBlockLexer

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The pages whose blocks run here; the others are listed in docs/contributing.md.
PAGES = [
    "README.md",
    *(
        f"docs/{name}.md"
        for name in (
            "quickstart",
            "drf",
            "production",
            "clients",
            "cors",
            "django",
            "downstream",
            "errors",
            "guarantees",
            "metrics",
            "ninja",
            "openapi",
            "operating",
            "security",
            "settings",
            "signals",
            "stores",
            "tasks",
            "testing",
            "webhooks",
            "writing-a-store",
        )
    ),
]
PYTHON_FENCE = re.compile(r"(?P<language>python|py)(?P<info>[^\n]*)$\n", re.MULTILINE)
TITLE = re.compile(r'^\s*(?:title="(?P<title>[^"]+)")?\s*$')


def _settings_namespace() -> dict[str, Any]:
    from django.conf import settings

    module = import_module(settings.SETTINGS_MODULE)
    return {k: copy.deepcopy(v) for k, v in vars(module).items() if k.isupper()}


#: compile() flags for a block: dont_inherit, so that this module's ``from __future__
#: import annotations`` does not turn a page's annotations into strings a reader's module
#: would evaluate (a @dataclass of a page looks its string annotations up in sys.modules).
INHERIT_NOTHING = {"dont_inherit": True}


def evaluate_settings(example: Example) -> None:
    from django.core import checks
    from django.test import override_settings

    from idempotency_django.conf import DEFAULTS

    namespace = _settings_namespace()
    before = copy.deepcopy(namespace)
    exec(
        compile(pad(example.parsed, example.line), example.path, "exec", **INHERIT_NOTHING),
        namespace,
    )
    unknown = set(namespace.get("IDEMPOTENCY", {})) - set(DEFAULTS)
    assert not unknown, f"not settings: {sorted(unknown)}"
    changed = {
        name: namespace[name]
        for name in ("IDEMPOTENCY", "CACHES")
        if name in namespace and namespace[name] != before.get(name)
    }
    with override_settings(**changed):
        from idempotency_django.checks import check_settings

        errors = [m for m in check_settings() if m.level >= checks.ERROR]
    assert not errors, errors
    example.namespace.setdefault("settings_blocks", []).append(namespace)


def evaluate_module(example: Example) -> None:
    namespace = example.namespace
    namespace.setdefault("__name__", f"bookings.docs_{Path(example.path).stem}")
    namespace.setdefault("__package__", "bookings")
    exec(
        compile(pad(example.parsed, example.line), example.path, "exec", **INHERIT_NOTHING),
        namespace,
    )


class PythonBlocks:
    """```python blocks (with an optional title="…"), and invisible ones."""

    def __init__(self) -> None:
        self.fences = RawFencedCodeBlockLexer(info_pattern=PYTHON_FENCE)
        self.invisible = DirectiveInHTMLCommentLexer(
            directive="invisible-code-block", arguments="python"
        )

    def __call__(self, document: Any) -> Any:
        for region in self.fences(document):
            info = TITLE.match(region.lexemes["info"])
            assert info, (
                f"{document.path}: a python fence Sybil cannot read: {region.lexemes['info']!r}"
            )
            title = info["title"] or ""
            region.parsed = textwrap.dedent(str(region.lexemes["source"]))
            region.evaluator = (
                evaluate_settings if title.endswith("settings.py") else evaluate_module
            )
            yield region
        for region in self.invisible(document):
            region.parsed = textwrap.dedent(str(region.lexemes["source"]))
            region.evaluator = evaluate_module
            yield region


def page_code(page: str, *indexes: int) -> str:
    """The source of a page's python fences (all, or those numbered, from 0), as Sybil
    reads them: a test of what a page shows runs the page's own code."""
    from sybil import Document

    text = (REPO_ROOT / page).read_text()
    regions = list(PythonBlocks().fences(Document(text, page)))
    chosen = [regions[i] for i in indexes] if indexes else regions
    return "\n".join(textwrap.dedent(str(r.lexemes["source"])) for r in chosen)


def block_defining(page: str, name: str) -> int:
    """The number of the page's python fence that defines ``name`` (a def or a class)."""
    from sybil import Document

    text = (REPO_ROOT / page).read_text()
    for index, region in enumerate(PythonBlocks().fences(Document(text, page))):
        if re.search(rf"^(?:def|class) {re.escape(name)}\b", str(region.lexemes["source"]), re.M):
            return index
    raise LookupError(f"{page} defines no {name}")


def run_page_code(page: str, namespace: dict[str, Any], *indexes: int) -> dict[str, Any]:
    """Runs page_code() in ``namespace`` and returns it."""
    exec(
        compile(page_code(page, *indexes), str(REPO_ROOT / page), "exec", **INHERIT_NOTHING),
        namespace,
    )
    return namespace


@pytest.fixture
def docs_db(transactional_db: None) -> None:
    """Each block may touch the database (the project's, migrated for the test)."""


sybil = Sybil(
    parsers=[PythonBlocks(), SkipParser()],
    path=str(REPO_ROOT),
    patterns=PAGES,
    fixtures=["docs_db"],
)
pytest_collect_file = sybil.pytest()
