"""The example's booking page in a real browser: headless Chromium driven by Playwright.

A double-click on Book, and a reload in the middle of a booking followed by a
resubmit, each make exactly one booking: the page makes its Idempotency-Key once
per form and keeps it in sessionStorage. Skipped unless the ``playwright`` package
and ``/usr/bin/chromium`` are installed (never ``playwright install``). Refreshes
docs/images/example-booking.png.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.browser import CHROMIUM, CHROMIUM_ARGS, DOCS_IMAGES
from tests.test_example_project import (
    PASSWORD,
    call,
    example_server,
    reserved_count,
    wait_until_reserved,
)

DOCS_IMAGE = DOCS_IMAGES / "example-booking.png"
DELAY_MS = 800

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")
if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)


def bookings_in(base: str, location: str) -> list[dict[str, object]]:
    reply = call(base, "GET", "/api/bookings/", location=location)
    assert reply.status == 200
    return reply.json()  # type: ignore[no-any-return]


def test_double_click_and_reload_make_one_booking_each(tmp_path: Path) -> None:
    with (
        example_server(tmp_path, DELAY_MS) as base,
        sync_api.sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 760})
            page.set_default_timeout(15_000)
            page.goto(base + "/")
            assert "/admin/login/" in page.url
            page.fill("#id_username", "alice")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(base + "/")

            # A double-click: two submits with one key. One runs; the other gets
            # 409 in progress, waits Retry-After, and is answered with the replay.
            first_key = page.text_content("#idempotency-key")
            assert first_key
            page.dblclick("#book")
            page.wait_for_selector('#result[data-replayed="true"]')
            assert "Idempotency-Replayed: true" in (page.text_content("#result") or "")
            assert len(bookings_in(base, "portland")) == 1
            page.wait_for_function("document.querySelectorAll('#bookings tr').length === 1")
            assert page.text_content("#idempotency-key") != first_key  # a new form, a new key

            # A reload while the booking is still running, then Book again.
            page.fill("#location", "lisbon")
            page.fill("#customer", "Ines Duarte")
            key = page.text_content("#idempotency-key")
            claimed = reserved_count(tmp_path)
            with page.expect_request("**/api/bookings/") as sent:
                page.click("#book")
            assert sent.value.headers["idempotency-key"] == key
            wait_until_reserved(tmp_path, claimed)  # the server has the key and is working
            page.reload()
            assert page.input_value("#location") == "lisbon"  # the form came back...
            assert page.text_content("#idempotency-key") == key  # ...with its key
            page.click("#book")
            page.wait_for_selector('#result[data-outcome="replayed"]')
            assert page.get_attribute("#result", "data-replayed") == "true"
            lisbon = bookings_in(base, "lisbon")
            assert len(lisbon) == 1
            assert lisbon[0]["customer"] == "Ines Duarte"
            page.wait_for_function("document.querySelectorAll('#bookings tr').length === 1")

            shot = tmp_path / "example-booking.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, DOCS_IMAGE)
