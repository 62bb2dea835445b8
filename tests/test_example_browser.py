"""The example's booking page in a real browser: headless Chromium driven by Playwright.

One operation per form contents, never stuck: a double-click, and a reload in the
middle of a booking followed by a resubmit, each make exactly one booking; a reload
mid-booking, an edit and Book make a new booking with a new key (not 409 reused
forever); going back to the first contents finds the first booking; a key that the
server knows with other contents is answered by showing the earlier booking and
starting over with a new key. At 390 px wide nothing is wider than the screen.
Skipped unless the ``playwright`` package and ``/usr/bin/chromium`` are installed
(never ``playwright install``). With ``UPDATE_SCREENSHOTS=1`` it refreshes
docs/images/example-booking.png.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import CHROMIUM, CHROMIUM_ARGS, publish_screenshot
from tests.test_example_project import (
    BOOKING,
    PASSWORD,
    call,
    example_server,
    gate_closed,
    reserved_count,
    wait_until_reserved,
)

PHONE = {"width": 390, "height": 844}

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")
if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)


def bookings_in(base: str, location: str) -> list[dict[str, Any]]:
    reply = call(base, "GET", "/api/bookings/", location=location)
    assert reply.status == 200
    return reply.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("browser")


@pytest.fixture(scope="module")
def base(server_dir: Path) -> Iterator[str]:
    with example_server(server_dir) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def logged_in_page(browser: Any, base: str, viewport: dict[str, int]) -> Any:
    page = browser.new_page(viewport=viewport)
    page.set_default_timeout(15_000)
    page.goto(base + "/")
    assert "/admin/login/" in page.url
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(base + "/")
    return page


def shown_key(page: Any) -> str:
    return str(page.get_attribute("#idempotency-key", "data-key"))


def book_and_reload_while_it_runs(page: Any, server_dir: Path) -> str:
    """Press Book, wait until the server claimed the key, reload; the key it sent.

    The booking is held at the server's gate until the reload is done, so the page
    that sent it never sees its answer.
    """
    with gate_closed(server_dir):
        claimed = reserved_count(server_dir)
        with page.expect_request("**/api/bookings/") as sent:
            page.click("#book")
        wait_until_reserved(server_dir, claimed)  # the server has the key and is working
        page.reload()
    return str(sent.value.headers["idempotency-key"])


def test_double_click_and_reload_make_one_booking_each(
    browser: Any, base: str, server_dir: Path, tmp_path: Path
) -> None:
    page = logged_in_page(browser, base, {"width": 900, "height": 760})

    # A double-click: two submits with one key. One runs (held at the gate); the other
    # gets 409 in progress, waits Retry-After, and is answered with the replay.
    assert shown_key(page) == ""  # no key yet: it is made for the contents at Book
    with gate_closed(server_dir), page.expect_response(lambda r: r.status == 409) as busy:
        page.dblclick("#book")
    assert busy.value.json()["code"] == "idempotency_key_in_progress"
    page.wait_for_selector('#result[data-replayed="true"]')
    assert "Idempotency-Replayed: true" in (page.text_content("#result") or "")
    assert len(bookings_in(base, "portland")) == 1
    page.wait_for_function("document.querySelectorAll('#bookings tr').length === 1")
    assert shown_key(page) == ""  # answered: the same contents again are a new booking

    # A reload while the booking is still running, then Book again: the same key.
    page.fill("#location", "lisbon")
    page.fill("#customer", "Ines Duarte")
    key = book_and_reload_while_it_runs(page, server_dir)
    assert page.input_value("#location") == "lisbon"  # the form came back...
    assert shown_key(page) == key  # ...with its key
    page.click("#book")
    page.wait_for_selector('#result[data-outcome="replayed"]')
    assert page.get_attribute("#result", "data-key") == key
    lisbon = bookings_in(base, "lisbon")
    assert [b["customer"] for b in lisbon] == ["Ines Duarte"]
    page.wait_for_function("document.querySelectorAll('#bookings tr').length === 1")

    shot = tmp_path / "example-booking.png"
    page.screenshot(path=str(shot), full_page=True)
    publish_screenshot(shot, "example-booking.png")
    page.close()


def test_reload_edit_and_book_is_a_new_operation(browser: Any, base: str, server_dir: Path) -> None:
    """The bug this page had: reload mid-booking, edit, Book gave 409 reused forever."""
    page = logged_in_page(browser, base, {"width": 900, "height": 760})
    page.fill("#location", "oslo")
    page.fill("#customer", "Kari Nordmann")
    first_key = book_and_reload_while_it_runs(page, server_dir)

    page.fill("#customer", "Ola Nordmann")  # other contents: another operation
    assert shown_key(page) == ""
    page.click("#book")
    page.wait_for_selector('#result[data-outcome="created"]')
    assert page.get_attribute("#result", "data-key") not in {first_key, ""}
    oslo = bookings_in(base, "oslo")
    assert sorted(b["customer"] for b in oslo) == ["Kari Nordmann", "Ola Nordmann"]

    # Back to the first contents: still the first operation, answered from the store.
    page.fill("#customer", "Kari Nordmann")
    assert shown_key(page) == first_key
    page.click("#book")
    page.wait_for_selector('#result[data-outcome="replayed"]')
    kari = next(b for b in oslo if b["customer"] == "Kari Nordmann")
    assert page.get_attribute("#result", "data-booking-id") == str(kari["id"])
    assert len(bookings_in(base, "oslo")) == 2
    page.close()


def test_a_reused_key_shows_the_earlier_booking_and_starts_over(browser: Any, base: str) -> None:
    """A key the server already holds for other contents (a tab of an older page)."""
    earlier = call(base, "POST", "/api/bookings/", BOOKING, key="old-tab-key", location="porto")
    assert earlier.status == 201
    page = logged_in_page(browser, base, {"width": 900, "height": 760})
    page.fill("#location", "porto")
    page.fill("#customer", "Rui Costa")  # not the contents the key was used with
    values = {"location": "porto", "slot": page.input_value("#slot"), "customer": "Rui Costa"}
    # The page's own format: JSON.stringify([location, slot, customer]) -> key.
    contents = json.dumps(
        [values["location"], values["slot"], values["customer"]], separators=(",", ":")
    )
    state = {"keys": {contents: "old-tab-key"}, "values": values}
    page.evaluate(
        "state => sessionStorage.setItem('idempotency:new-booking', JSON.stringify(state))", state
    )
    page.reload()
    assert shown_key(page) == "old-tab-key"

    page.click("#book")
    page.wait_for_selector('#result[data-outcome="reused"]')
    text = page.text_content("#result") or ""
    assert "went through" in text and f"#{earlier.json()['id']}" in text
    assert page.get_attribute("#result", "data-booking-id") == str(earlier.json()["id"])
    assert shown_key(page) == ""  # a new operation
    assert len(bookings_in(base, "porto")) == 1

    page.click("#book")
    page.wait_for_selector('#result[data-outcome="created"]')
    assert page.get_attribute("#result", "data-key") not in {"old-tab-key", ""}
    assert sorted(b["customer"] for b in bookings_in(base, "porto")) == [
        "Dana Whitfield",
        "Rui Costa",
    ]
    page.close()


#: Elements whose right edge is past the viewport, and the page's scroll width.
OVERFLOW = """() => ({
  scrollWidth: document.documentElement.scrollWidth,
  wider: [...document.querySelectorAll("body *")]
    .filter((el) => el.getBoundingClientRect().right > window.innerWidth + 0.5)
    .map((el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")),
})"""


def test_the_page_fits_a_phone(browser: Any, base: str, tmp_path: Path) -> None:
    page = logged_in_page(browser, base, PHONE)
    page.fill("#location", "a-location-with-a-long-name-on-a-small-screen")
    page.click("#book")
    page.wait_for_selector('#result[data-outcome="created"]')
    page.wait_for_function("document.querySelectorAll('#bookings tr').length === 1")
    measured = page.evaluate(OVERFLOW)
    page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
    assert measured == {"scrollWidth": PHONE["width"], "wider": []}
    for selector in ("#location", "#slot", "#customer"):
        box = page.locator(selector).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    page.close()
