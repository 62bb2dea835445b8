"""Requiring keys where they make sense, and never where it would lock people out."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import checks
from django.test import Client, override_settings

from idempotency_django.checks import check_settings
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

BODY = json.dumps({"slot": "2026-07-30T09:00:00Z"})


def post(client: Client, url: str, key: str | None = None):  # type: ignore[no-untyped-def]
    headers: dict[str, Any] = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(url, BODY, content_type="application/json", **headers)


def missing(response) -> bool:  # type: ignore[no-untyped-def]
    code = response.json()["code"] if response.status_code == 400 else None
    return code == "idempotency_key_missing"


@override_settings(IDEMPOTENCY={"REQUIRED": True})
def test_required_applies_to_views_that_opted_in(alice_client: Client) -> None:
    assert missing(post(alice_client, "/plain/cbv/"))  # @idempotent
    assert missing(post(alice_client, "/api/bookings/"))  # a DRF viewset under @idempotent
    # A plain view the middleware protects did not opt in: it runs as without the setting.
    assert post(alice_client, "/plain/bookings/").status_code == 201
    assert Booking.objects.count() == 1


@override_settings(IDEMPOTENCY={"REQUIRED_PATHS": [r"^/plain/"]})
def test_required_paths_apply_to_plain_views(alice_client: Client) -> None:
    assert missing(post(alice_client, "/plain/bookings/"))
    assert post(alice_client, "/plain/bookings/", key="k1").status_code == 201
    assert post(alice_client, "/plain/exempt/").status_code == 201  # @idempotency_exempt
    assert Booking.objects.count() == 2


@override_settings(IDEMPOTENCY={"REQUIRED": True, "REQUIRED_PATHS": [r"^/"]})
def test_the_admin_login_never_needs_a_key(alice: User) -> None:
    """Even a pattern matching every path leaves the admin usable: a real login, CSRF on."""
    alice.is_staff = True
    alice.save()
    browser = Client(enforce_csrf_checks=True)
    page = browser.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert token is not None
    login = browser.post(
        "/admin/login/?next=/admin/",
        {
            "csrfmiddlewaretoken": token.group(1),
            "username": "alice",
            "password": "alice-password",
            "next": "/admin/",
        },
    )
    assert login.status_code == 302, login.content[:300]
    assert login["Location"] == "/admin/"
    assert browser.get("/admin/").status_code == 200


def messages(**idempotency: object) -> set[str]:
    with override_settings(IDEMPOTENCY=idempotency):
        return {message.id or "" for message in check_settings()}


def test_a_pattern_matching_the_admin_is_flagged() -> None:
    assert "idempotency_django.W002" in messages(REQUIRED_PATHS=[r"^/"])
    assert "idempotency_django.W002" not in messages(REQUIRED_PATHS=[r"^/api/"])


def test_invalid_patterns_are_errors() -> None:
    assert "idempotency_django.E013" in messages(REQUIRED_PATHS=["^/api/("])
    assert "idempotency_django.E004" in messages(REQUIRED_PATHS="^/api/")
    assert "idempotency_django.E004" in messages(REQUIRED_PATHS=[3])


def test_the_check_is_a_warning_not_an_error() -> None:
    with override_settings(IDEMPOTENCY={"REQUIRED_PATHS": [r"^/"]}):
        levels = {message.level for message in check_settings()}
    assert levels == {checks.WARNING}
