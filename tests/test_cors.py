"""docs/cors.md: with its django-cors-headers settings, a front end on another origin
may send Idempotency-Key and X-Location-Id, and read Idempotency-Replayed and
Retry-After."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core import checks
from django.test import Client, override_settings

from tests.docs_blocks import run_page_code

pytest.importorskip(
    "corsheaders", reason="django-cors-headers is missing (pip install -e '.[dev]')"
)

ORIGIN = "https://app.example.com"


@pytest.fixture
def cors() -> object:
    # The page's block, as it runs at the end of a settings module with these two lists.
    cors_settings = run_page_code(
        "docs/cors.md",
        {"INSTALLED_APPS": [], "MIDDLEWARE": ["django.middleware.common.CommonMiddleware"]},
    )
    assert cors_settings["INSTALLED_APPS"] == ["corsheaders"]
    middleware = [name for name in cors_settings["MIDDLEWARE"] if "corsheaders" in name]
    with override_settings(
        INSTALLED_APPS=[*settings.INSTALLED_APPS, "corsheaders"],
        MIDDLEWARE=[*middleware, *settings.MIDDLEWARE],
        **{name: value for name, value in cors_settings.items() if name.startswith("CORS_")},
    ):
        yield


def test_the_settings_pass_the_cors_checks(cors: object) -> None:
    from corsheaders.checks import check_settings

    assert [m for m in check_settings() if m.level >= checks.WARNING] == []


def test_a_preflight_allows_the_two_request_headers(cors: object) -> None:
    answer = Client().options(
        "/plain/bookings/",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, idempotency-key, x-location-id",
        },
    )
    assert answer.status_code == 200
    assert answer["Access-Control-Allow-Origin"] == ORIGIN
    allowed = {h.strip() for h in answer["Access-Control-Allow-Headers"].split(",")}
    assert {"idempotency-key", "x-location-id", "content-type"} <= allowed


def test_a_replay_and_retry_after_are_readable(cors: object, alice: User) -> None:
    client = Client()
    client.force_login(alice)
    headers = {"Origin": ORIGIN, "Idempotency-Key": "cors-1", "X-Location-Id": "portland"}
    body = json.dumps({"slot": "2026-07-30T09:00"})
    for _ in range(2):
        answer = client.post("/plain/bookings/", body, "application/json", headers=headers)
    assert answer["Idempotency-Replayed"] == "true"
    assert answer["Access-Control-Allow-Origin"] == ORIGIN
    exposed = {h.strip().lower() for h in answer["Access-Control-Expose-Headers"].split(",")}
    assert exposed == {"idempotency-replayed", "retry-after"}


def test_another_origin_is_not_allowed(cors: object) -> None:
    answer = Client().options(
        "/plain/bookings/",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "Access-Control-Allow-Origin" not in answer
