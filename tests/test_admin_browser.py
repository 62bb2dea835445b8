"""The admin in a real browser: headless Chromium driven by Playwright, 1280 px wide.

Skipped unless the ``playwright`` package and ``/usr/bin/chromium`` are installed
(``pip install playwright`` and ``apt-get install chromium``; no ``playwright install``).
With ``UPDATE_SCREENSHOTS=1`` it also refreshes the screenshots in ``docs/images``.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import django.contrib.admin
import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import override_settings
from django.utils import timezone

from idempotency_django.admin.display import TOKEN_MAX_LENGTH
from idempotency_django.models import IdempotencyRecord
from tests.browser import CHROMIUM, CHROMIUM_ARGS, publish_screenshot
from tests.factories import IdempotencyRecordFactory

WIDTH = 1280
RECORDS = "/admin/idempotency_django/idempotencyrecord/"
DELIVERIES = "/admin/idempotency_django/webhookdelivery/"
SECRET = "sk_live_9f2c41d07be3"


@pytest.fixture(scope="session")
def admin_static() -> Any:
    """Serve the admin's CSS and JS from the live server when the test settings don't.

    tests/settings.py has no STATIC_URL and no staticfiles app; without them the
    live server cannot serve static files and the admin renders unstyled. This
    points STATIC_URL at the admin's own static directory for the session; it
    must be set up before ``live_server`` (session-scoped) starts, so list it
    first. A no-op once the settings configure static files themselves.
    """
    if settings.STATIC_URL:
        yield
        return
    root = Path(django.contrib.admin.__file__).parent / "static"
    with override_settings(STATIC_URL="/static/", STATIC_ROOT=str(root)):
        yield


def make_records() -> Any:
    """A realistic page: users' bookings, a service principal, a delivery, a stuck key."""
    now = timezone.now()
    alice = User.objects.create_user("alice", "alice@example.com", "alice-password")
    bruno = User.objects.create_user("bruno.costa", "bruno@example.com", "bruno-password")
    body = (
        b'{"id": 4182, "status": "booked", "room": "Kestrel", "nights": 3, "total": "387.00", '
        b'"api_secret": "' + SECRET.encode() + b'"}'
    )
    headers = [["Content-Type", "application/json"], ["Location", "/api/bookings/4182/"]]
    shown = IdempotencyRecordFactory.create(
        key="8e0c6f5e-6b1d-4d2b-9a57-2f7c1f6a9d01",
        principal=f"auth.user:{alice.pk}",
        location="hotel-lisbon",
        path="/api/bookings/",
        request_id="req-7f3a9c",
        status_code=201,
        response_headers=headers,
        response_body=body,
        created_at=now - timedelta(minutes=2),
    )
    IdempotencyRecordFactory.create(
        key="c41d7a22-0e0b-4f8e-a1c3-55b0d2e7f4aa",
        principal=f"auth.user:{alice.pk}",
        location="hotel-lisbon",
        path="/api/bookings/",
        in_progress=True,
        created_at=now - timedelta(seconds=20),
    )
    IdempotencyRecordFactory.create(
        key="1f9b3e70-2c4d-4a8b-b6e2-9d0a7c5e3f12",
        principal=f"auth.user:{bruno.pk}",
        location="hotel-porto",
        method="PATCH",
        path="/api/bookings/4100/",
        status_code=422,
        created_at=now - timedelta(hours=1),
    )
    IdempotencyRecordFactory.create(
        key="5a2e8d14-7b3f-4c6a-8e1d-0f4b9c2a7e63",
        principal="svc.billing-reconciler",
        path="/plain/bookings/",
        in_progress=True,
        created_at=now - timedelta(hours=2),
        expires_at=now - timedelta(hours=2) + timedelta(seconds=300),
    )
    IdempotencyRecordFactory.create(
        key="d7c3b9a1-4e5f-4b2a-9c8d-6e1f0a3b5c27",
        principal="sha256:" + "5e" * 32,  # a principal too long for its column
        method="DELETE",
        path="/api/bookings/3999/cancellations/2024-11-30T10:15:00Z/",
        status_code=204,
        response_body=b"",
        created_at=now - timedelta(days=2),
        expires_at=now - timedelta(days=1),
    )
    for n, source in enumerate(["standard-webhooks", "github", "fallback"]):
        IdempotencyRecordFactory.create(
            kind="webhook",
            key=f"msg_2Lh9xQ7vUu3pZk{n}" if n != 1 else "5f1d3c2a-9b8e-11ef-8c3e-0242ac120002",
            source=source,
            principal="webhook:" + f"{n}d4c8e1f07a9b3c6" * 4,
            path="hooks/<str:token>/",
            response_body=b'{"status": "accepted", "run_id": "run-%d"}' % (77 + n),
            created_at=now - timedelta(minutes=5 * n),
            expires_at=now + timedelta(days=7),
        )
    return shown


def assert_list_fits(page: Any, *headers: str) -> None:
    """No horizontal scrolling, of the page or of the results table, at this width."""
    sizes = page.evaluate(
        """() => {
            const results = document.querySelector('#changelist-form .results');
            return {
                page: document.documentElement.scrollWidth,
                resultsScroll: results.scrollWidth,
                resultsClient: results.clientWidth,
                tableRight: document.querySelector('#result_list').getBoundingClientRect().right,
            };
        }"""
    )
    assert sizes["page"] <= WIDTH, sizes
    assert sizes["resultsScroll"] <= sizes["resultsClient"], sizes
    assert sizes["tableRight"] <= WIDTH, sizes
    for header in headers:
        box = page.locator("#result_list thead th", has_text=header).bounding_box()
        assert box is not None, header
        assert box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, (header, box)


def assert_tokens_unbroken(page: Any) -> None:
    """Every word of the principal and request columns is on one line ("alice",
    "(auth.user:1)", "POST", "/api/bookings/"): the columns break between words only.
    A word the admin lets break (longer than TOKEN_MAX_LENGTH: a digest principal, a
    timestamp in a path) is exempt."""
    broken = page.evaluate(
        """(longest) => {
            const broken = [];
            const cells = document.querySelectorAll(
                '#result_list .field-scope_display, #result_list .field-request_display');
            for (const cell of cells) {
                const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
                for (let node = walker.nextNode(); node; node = walker.nextNode()) {
                    for (const match of node.data.matchAll(/\\S+/g)) {
                        if (match[0].length > longest) continue;
                        const range = document.createRange();
                        range.setStart(node, match.index);
                        range.setEnd(node, match.index + match[0].length);
                        const tops = new Set([...range.getClientRects()].map(r => r.top));
                        if (tops.size > 1) broken.push(match[0]);
                    }
                }
            }
            return broken;
        }""",
        TOKEN_MAX_LENGTH,
    )
    assert broken == [], broken


@pytest.mark.django_db(transaction=True)
def test_admin_in_a_browser(admin_static: None, live_server: Any, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")

    User.objects.create_superuser("root", "root@example.com", "root-password")
    viewer = User.objects.create_user("viewer", password="viewer-password", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_idempotencyrecord"))
    record = make_records()
    stuck = IdempotencyRecord.objects.get(key="c41d7a22-0e0b-4f8e-a1c3-55b0d2e7f4aa")
    base = live_server.url
    shots: dict[str, Path] = {}

    def login(page: Any, username: str, next_url: str) -> None:
        page.goto(f"{base}/admin/login/?next={next_url}")
        page.fill("#id_username", username)
        page.fill("#id_password", f"{username}-password")
        page.click("input[type=submit]")

    def screenshot(page: Any, name: str, **options: Any) -> None:
        page.evaluate("window.scrollTo(0, 0)")
        shots[name] = tmp_path / name
        page.screenshot(path=str(shots[name]), **options)

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            # The navigation sidebar stays open, as a first visit shows it.
            page = browser.new_page(viewport={"width": WIDTH, "height": 820})
            login(page, "root", RECORDS)
            page.wait_for_selector("#result_list")
            assert page.locator("#nav-sidebar").is_visible()
            assert "Select idempotency record to view" in page.content()
            assert page.locator("#result_list tbody tr").count() == 5
            text = page.inner_text("#result_list")
            assert record.key in text
            assert f"alice (auth.user:{record.principal.split(':')[1]})" in text
            assert "in progress" in text and "completed" in text and "expired" in text
            actions = page.inner_text("select[name=action]")
            assert "Release selected stuck reservations" in actions
            assert "Delete all records of the selected records' principals" in actions
            assert_list_fits(page, "Created", "Expires")
            assert_tokens_unbroken(page)
            # Collapsed (the admin remembers it), the columns have room to breathe.
            page.click("#toggle-nav-sidebar")
            assert_list_fits(page, "Created", "Expires")
            assert_tokens_unbroken(page)
            screenshot(page, "admin-changelist.png")

            page.fill("#searchbar", "alice")
            page.press("#searchbar", "Enter")
            page.wait_for_selector("#result_list")
            assert page.locator("#result_list tbody tr").count() == 2

            page.click(f"text={record.key}")
            page.wait_for_selector(".idempotency-body")
            body = page.inner_text(".idempotency-body")
            assert '"status": "booked"' in body and "\n  " in body and SECRET in body
            assert "/api/bookings/4182/" in page.inner_text(".idempotency-headers")
            assert record.token not in page.content()
            assert page.locator("input[name=_save]").count() == 0
            assert page.title().startswith(f"{record.key} by alice at hotel-lisbon |")
            assert "(auth.user:" not in page.inner_text("div.breadcrumbs")
            screenshot(page, "admin-record.png", full_page=True)

            # A reservation in progress: released by the action, on Django's delete page.
            page.goto(f"{base}{RECORDS}")
            page.check(f"input[name=_selected_action][value='{stuck.pk}']")
            page.select_option("select[name=action]", "release_reservations")
            page.click("button[name=index]")
            page.wait_for_selector("body.delete-selected-confirmation")
            assert "Release stuck reservations?" in page.inner_text("#content h1")
            assert "still within its takeover window" in page.inner_text("#content")
            assert stuck.key in page.inner_text("#content")
            screenshot(page, "admin-release-confirmation.png")
            page.click("input[type=submit]")
            page.wait_for_selector("#result_list")
            assert "Released 1 reservation." in page.inner_text(".messagelist")
            assert stuck.key not in page.inner_text("#result_list")

            page.goto(f"{base}{DELIVERIES}")
            page.wait_for_selector("#result_list")
            headings = page.inner_text("#result_list thead")
            assert "DELIVERY ID" in headings and "IDEMPOTENCY KEY" not in headings
            digest = page.locator("#result_list tbody code").first
            assert len(digest.inner_text()) == 13  # 12 hex digits and an ellipsis
            assert len(digest.get_attribute("title") or "") == 64
            assert_list_fits(page, "Received", "Expires")
            page.click("#toggle-nav-sidebar")
            assert page.locator("#nav-sidebar").is_visible()
            assert_list_fits(page, "Received", "Expires")
            page.click("#toggle-nav-sidebar")
            screenshot(page, "admin-deliveries.png")

            # Staff who may view records but not stored responses.
            restricted = browser.new_page(viewport={"width": WIDTH, "height": 820})
            login(restricted, "viewer", f"{RECORDS}{record.pk}/change/")
            restricted.wait_for_selector(".idempotency-body-summary")
            assert SECRET not in restricted.content()
            assert "/api/bookings/4182/" not in restricted.content()
            summary = restricted.inner_text(".idempotency-body-summary")
            assert f"{len(record.response_body)} bytes, application/json, digest" in summary
            screenshot(restricted, "admin-record-restricted.png", full_page=True)
        finally:
            browser.close()

    for name, path in shots.items():
        assert path.stat().st_size > 10_000, name
        publish_screenshot(path, name)
