"""HTML forms posted by a logged-in browser: CSRF enforced, session from the login page.

The form view is a plain Django view, protected by the middleware.
"""

from __future__ import annotations

from io import StringIO
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client
from django.test.client import MULTIPART_CONTENT

from idempotency_django.models import IdempotencyRecord
from tests.real_stack.clients import browser, csrf_token_of
from tests.real_stack.middleware import IDEMPOTENCY, STARTPROJECT
from tests.testapp.models import Booking

FORM = "/real/form/"
FIELDS = {"slot": "2026-07-30T09:00", "customer": "Alice"}


@pytest.fixture
def alice_browser(alice: User) -> Client:
    return browser("alice", "alice-password")


def post_urlencoded(client: Client, token: str, key: str):  # type: ignore[no-untyped-def]
    body = urlencode({**FIELDS, "csrfmiddlewaretoken": token})
    return client.post(
        FORM,
        body,
        content_type="application/x-www-form-urlencoded",
        headers={"Idempotency-Key": key, "X-CSRFToken": token},
    )


def post_multipart(client: Client, token: str, key: str):  # type: ignore[no-untyped-def]
    fields = {
        **FIELDS,
        "csrfmiddlewaretoken": token,
        "attachment": SimpleUploadedFile("ticket.txt", b"seat 12A", content_type="text/plain"),
    }
    return client.post(
        FORM,
        fields,
        content_type=MULTIPART_CONTENT,
        headers={"Idempotency-Key": key, "X-CSRFToken": token},
    )


def test_urlencoded_form_books_once_and_its_retry_replays(alice_browser: Client) -> None:
    token = csrf_token_of(alice_browser, FORM)
    first = post_urlencoded(alice_browser, token, "form-1")
    retry = post_urlencoded(alice_browser, token, "form-1")
    assert first.status_code == 201, first.content
    assert "Idempotency-Replayed" not in first
    assert retry.status_code == 201
    assert retry["Idempotency-Replayed"] == "true"
    assert retry.content == first.content
    assert Booking.objects.get().customer == "Alice"


def test_multipart_form_books_once_and_its_retry_replays(alice_browser: Client) -> None:
    token = csrf_token_of(alice_browser, FORM)
    first = post_multipart(alice_browser, token, "form-2")
    retry = post_multipart(alice_browser, token, "form-2")
    assert first.status_code == 201, first.content
    assert first.json()["attachment"] == "seat 12A"
    assert retry.status_code == 201
    assert retry["Idempotency-Replayed"] == "true"
    assert retry.content == first.content
    assert Booking.objects.count() == 1


def test_a_key_is_scoped_to_the_user_who_logged_in(alice_browser: Client, bob: User) -> None:
    bob_browser = browser("bob", "bob-password")
    alice_first = post_urlencoded(alice_browser, csrf_token_of(alice_browser, FORM), "shared")
    bob_first = post_urlencoded(bob_browser, csrf_token_of(bob_browser, FORM), "shared")
    assert alice_first.status_code == bob_first.status_code == 201
    assert "Idempotency-Replayed" not in bob_first
    assert sorted(Booking.objects.values_list("owner__username", flat=True)) == ["alice", "bob"]


def test_a_post_that_csrf_rejects_runs_nothing_and_leaves_the_key_free(
    alice_browser: Client,
) -> None:
    rejected = post_urlencoded(alice_browser, "not-the-token", "form-3")
    assert rejected.status_code == 403
    assert Booking.objects.count() == 0
    assert not IdempotencyRecord.objects.exists()
    accepted = post_urlencoded(alice_browser, csrf_token_of(alice_browser, FORM), "form-3")
    assert accepted.status_code == 201
    assert "Idempotency-Replayed" not in accepted
    assert Booking.objects.count() == 1


# -- where the middleware goes: what docs/troubleshooting.md says, checked ---------------

CSRF = "django.middleware.csrf.CsrfViewMiddleware"
AUTHENTICATION = "django.contrib.auth.middleware.AuthenticationMiddleware"


def placed(order: list[str]) -> list[str]:
    """``startproject``'s list with these middlewares in this relative order."""
    rest = [m for m in STARTPROJECT if m not in order]
    return rest[:2] + order + rest[2:]


def test_before_csrf_passes_the_check_and_csrf_still_rejects(settings: Any, alice: User) -> None:
    """The middleware never calls the view, so CSRF's process_view runs whichever comes
    first: listed before CsrfViewMiddleware there is nothing to report and nothing lost."""
    settings.MIDDLEWARE = placed([AUTHENTICATION, IDEMPOTENCY, CSRF])
    call_command("check", "--fail-level", "WARNING", stdout=StringIO())
    client = browser("alice", "alice-password")
    rejected = post_urlencoded(client, "not-the-token", "order-1")
    assert rejected.status_code == 403
    assert not IdempotencyRecord.objects.exists()
    token = csrf_token_of(client, FORM)
    first, retry = (post_urlencoded(client, token, "order-1") for _ in range(2))
    assert first.status_code == retry.status_code == 201, first.content
    assert retry["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1


def test_before_authentication_is_reported_by_the_check(settings: Any) -> None:
    settings.MIDDLEWARE = placed([IDEMPOTENCY, CSRF, AUTHENTICATION])
    with pytest.raises(SystemCheckError, match=r"idempotency_django\.E001"):
        call_command("check", stdout=StringIO(), stderr=StringIO())


# -- the same browser posting JSON to a DRF view (session authentication enforces CSRF) --


def post_json(client: Client, token: str | None, key: str):  # type: ignore[no-untyped-def]
    headers = {"Idempotency-Key": key}
    if token is not None:
        headers["X-CSRFToken"] = token
    return client.post(
        "/api/bookings/",
        {"slot": "2026-07-30T09:00"},
        content_type="application/json",
        headers=headers,
    )


def test_json_post_to_a_drf_view_books_once_and_its_retry_replays(alice_browser: Client) -> None:
    token = csrf_token_of(alice_browser, FORM)
    first = post_json(alice_browser, token, "drf-1")
    retry = post_json(alice_browser, token, "drf-1")
    assert first.status_code == retry.status_code == 201
    assert retry["Idempotency-Replayed"] == "true"
    assert retry.content == first.content
    assert Booking.objects.count() == 1


def test_json_post_to_a_drf_view_without_its_csrf_token_leaves_the_key_free(
    alice_browser: Client,
) -> None:
    rejected = post_json(alice_browser, None, "drf-2")
    assert rejected.status_code == 403
    assert Booking.objects.count() == 0
    accepted = post_json(alice_browser, csrf_token_of(alice_browser, FORM), "drf-2")
    assert accepted.status_code == 201
    assert "Idempotency-Replayed" not in accepted
