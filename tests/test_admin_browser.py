"""The admin in a real browser: headless Chromium driven by Playwright.

Skipped unless the ``playwright`` package and ``/usr/bin/chromium`` are installed
(``pip install playwright`` and ``apt-get install chromium``; no ``playwright install``).
Also refreshes the screenshots in ``docs/images``.
"""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import django.contrib.admin
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import override_settings
from django.utils import timezone

from tests.browser import CHROMIUM, CHROMIUM_ARGS, DOCS_IMAGES
from tests.factories import IdempotencyRecordFactory


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
    now = timezone.now()
    body = b'{"id": 4182, "status": "booked", "room": "Kestrel", "nights": 3, "total": "387.00"}'
    headers = [["Content-Type", "application/json"], ["Location", "/api/bookings/4182/"]]
    shown = IdempotencyRecordFactory(
        key="8e0c6f5e-6b1d-4d2b-9a57-2f7c1f6a9d01",
        principal="user:42",
        location="hotel-lisbon",
        path="/api/bookings/",
        request_id="req-7f3a9c",
        status_code=201,
        response_headers=headers,
        response_body=body,
        created_at=now - timedelta(minutes=2),
    )
    IdempotencyRecordFactory(
        key="c41d7a22-0e0b-4f8e-a1c3-55b0d2e7f4aa",
        principal="user:42",
        location="hotel-lisbon",
        path="/api/bookings/",
        in_progress=True,
        created_at=now - timedelta(seconds=20),
    )
    IdempotencyRecordFactory(
        key="1f9b3e70-2c4d-4a8b-b6e2-9d0a7c5e3f12",
        principal="user:7",
        location="hotel-porto",
        method="PATCH",
        path="/api/bookings/4100/",
        status_code=422,
        created_at=now - timedelta(hours=1),
    )
    IdempotencyRecordFactory(
        key="5a2e8d14-7b3f-4c6a-8e1d-0f4b9c2a7e63",
        principal="user:19",
        path="/plain/bookings/",
        in_progress=True,
        created_at=now - timedelta(hours=2),
        expires_at=now - timedelta(hours=2) + timedelta(seconds=300),
    )
    IdempotencyRecordFactory(
        key="d7c3b9a1-4e5f-4b2a-9c8d-6e1f0a3b5c27",
        principal="user:19",
        method="DELETE",
        path="/api/bookings/3999/",
        status_code=204,
        response_body=b"",
        created_at=now - timedelta(days=2),
        expires_at=now - timedelta(days=1),
    )
    return shown


@pytest.mark.django_db(transaction=True)
def test_admin_in_a_browser(admin_static: None, live_server: Any, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")

    User.objects.create_superuser("root", "root@example.com", "root-password")
    record = make_records()
    base = live_server.url

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 820})
            page.goto(f"{base}/admin/login/?next=/admin/idempotency_django/idempotencyrecord/")
            page.fill("#id_username", "root")
            page.fill("#id_password", "root-password")
            page.click("input[type=submit]")
            page.wait_for_selector("#result_list")
            if page.locator("#toggle-nav-sidebar").is_visible():
                page.click("#toggle-nav-sidebar")  # more room for the columns

            assert "Select idempotency record to view" in page.content()
            rows = page.locator("#result_list tbody tr")
            assert rows.count() == 5
            text = page.inner_text("#result_list")
            assert record.key in text
            assert "in progress" in text and "completed" in text and "expired" in text
            assert "Release selected stuck reservations" in page.inner_text("select[name=action]")
            assert "By state" in page.inner_text("#changelist-filter")
            page.evaluate("window.scrollTo(0, 0)")
            changelist_png = tmp_path / "admin-changelist.png"
            page.screenshot(path=str(changelist_png))

            page.click(f"text={record.key}")
            page.wait_for_selector(".idempotency-body")
            body = page.inner_text(".idempotency-body")
            assert '"status": "booked"' in body and "\n  " in body
            assert "/api/bookings/4182/" in page.inner_text(".idempotency-headers")
            assert record.token not in page.content()
            assert page.locator("input[name=_save]").count() == 0
            record_png = tmp_path / "admin-record.png"
            page.screenshot(path=str(record_png), full_page=True)
        finally:
            browser.close()

    assert changelist_png.stat().st_size > 10_000
    assert record_png.stat().st_size > 10_000
    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(changelist_png, DOCS_IMAGES / "admin-changelist.png")
    shutil.copyfile(record_png, DOCS_IMAGES / "admin-record.png")
