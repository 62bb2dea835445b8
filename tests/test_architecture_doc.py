"""docs/architecture.md's table of where each setting is read is the code's."""

from __future__ import annotations

import re
from pathlib import Path

import idempotency_django
from idempotency_django.conf import DEFAULTS

PACKAGE = Path(idempotency_django.__file__).parent
PAGE = PACKAGE.parent / "docs" / "architecture.md"
#: Modules that read every setting: the settings themselves, the checks, the test helpers.
EVERYWHERE = {"conf.py", "checks.py", "testing.py"}


def readers(name: str) -> set[str]:
    """The modules that name setting ``name`` (``settings.NAME`` or ``"NAME"``)."""
    pattern = re.compile(rf"\.{name}\b|[\"']{name}[\"']")
    return {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts
        and path.name not in EVERYWHERE
        and pattern.search(path.read_text())
    }


def documented() -> dict[str, set[str]]:
    rows = re.findall(
        r"^\| \[`([A-Z_]+)`\]\(settings\.md#[a-z_]+\) \| (.*) \|$", PAGE.read_text(), re.M
    )
    return {name: set(re.findall(r"`([\w/.]+\.py)`", modules)) for name, modules in rows}


def test_every_setting_is_on_the_page_with_the_modules_that_read_it() -> None:
    table = documented()
    assert list(table) == list(DEFAULTS)
    for name in DEFAULTS:
        assert table[name] == readers(name), name


def test_the_reader_search_finds_what_it_should() -> None:
    assert "protocol/attempt.py" in readers("RETAIN_FUNCTION")
    assert readers("NOT_A_SETTING") == set()
