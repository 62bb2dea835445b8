"""A key the library did not use is never silently ignored: the answer says so.

``Idempotency-Key-Ignored: anonymous`` when the request had no principal (under
``ANONYMOUS="ignore"``), ``unprotected`` when no part of the library protects the
view; the first unprotected request of each route is logged at WARNING.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import checks
from django.test import Client, override_settings
from rest_framework.test import APIClient

from idempotency_django.models import IdempotencyRecord
from idempotency_django.protocol import phases
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

HEADER = "Idempotency-Key-Ignored"


def post(client: Client, url: str, key: str | None = "k-1") -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post(
        url, json.dumps({"slot": "s"}), content_type="application/json", headers=headers
    )


@pytest.fixture(autouse=True)
def fresh_route_log() -> None:
    phases._LOGGED_UNPROTECTED.clear()


def test_an_anonymous_caller_is_told_its_key_was_not_used() -> None:
    first = post(Client(), "/plain/bookings/")
    assert first[HEADER] == "anonymous"
    assert post(Client(), "/plain/bookings/")[HEADER] == "anonymous"
    assert Booking.objects.count() == 2  # as the header warned


def test_a_view_nothing_protects_says_so_and_is_logged_once_per_route(
    alice: User, alice_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    api = APIClient()
    api.force_login(alice)
    with caplog.at_level(logging.WARNING, "idempotency_django"):
        first = post(api, "/api/unprotected-bookings/", key="u-1")
        second = post(api, "/api/unprotected-bookings/", key="u-2")
        exempt = post(alice_client, "/plain/exempt/", key="e-1")
    assert first.status_code == second.status_code == 201
    assert first[HEADER] == second[HEADER] == exempt[HEADER] == "unprotected"
    warnings = [r.getMessage() for r in caplog.records if "event=unprotected" in r.getMessage()]
    assert len(warnings) == 2, warnings  # one per route
    assert "route=api/unprotected-bookings/" in warnings[0]
    assert "u-1" not in " ".join(warnings)  # never the key


def test_protected_answers_and_their_replays_carry_no_such_header(
    alice: User, alice_client: Client
) -> None:
    first = post(alice_client, "/plain/bookings/")
    replay = post(alice_client, "/plain/bookings/")
    assert replay["Idempotency-Replayed"] == "true"
    assert HEADER not in first and HEADER not in replay
    api = APIClient()
    api.force_login(alice)
    assert HEADER not in post(api, "/api/bookings/", key="drf-1")


def test_requests_without_a_key_and_safe_methods_are_left_alone(alice_client: Client) -> None:
    assert HEADER not in post(alice_client, "/api/unprotected-bookings/", key=None)
    assert HEADER not in alice_client.get("/api/unprotected-bookings/", HTTP_IDEMPOTENCY_KEY="g")


@override_settings(IDEMPOTENCY={"MARKER_HEADERS": {"KEY_IGNORED": None}})
def test_the_header_can_be_turned_off() -> None:
    assert HEADER not in post(Client(), "/plain/bookings/")


def test_without_the_middleware_a_drf_view_still_tells_an_anonymous_caller(
    settings: Any,
) -> None:
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if m != "idempotency_django.middleware.IdempotencyMiddleware"
    ]
    answer = post(APIClient(), "/api/public/", key="anon-1")
    assert answer.status_code == 201
    assert answer[HEADER] == "anonymous"


def test_a_check_names_the_ninja_operations_the_integration_does_not_protect() -> None:
    pytest.importorskip("ninja")
    from idempotency_django.checks import check_ninja_operations

    _, warning = check_ninja_operations()
    assert warning.id == "idempotency_django.W043"
    assert "core-decorated" not in warning.msg  # an error of its own (E017)
    assert "ninja/unprotected-bookings (POST)" in warning.msg
    assert "ninja/bookings " not in warning.msg  # protected by the integration
    assert "exempt" not in warning.msg  # @idempotency_exempt says it is meant


def test_the_django_decorator_on_a_ninja_operation_is_an_error_at_check_time() -> None:
    """Not a warning at check time and a 500 at request time (issue 38, item 7)."""
    pytest.importorskip("ninja")
    from idempotency_django.checks import check_ninja_operations

    error = check_ninja_operations()[0]
    assert error.id == "idempotency_django.E017" and error.level == checks.ERROR
    assert "ninja/core-decorated (POST)" in error.msg
    assert "ninja/bookings " not in error.msg and "unprotected" not in error.msg


@override_settings(IDEMPOTENCY={"METHODS": ("DELETE",)})
def test_the_ninja_check_counts_only_the_methods_keys_protect() -> None:
    pytest.importorskip("ninja")
    from idempotency_django.checks import check_ninja_operations

    assert check_ninja_operations() == []  # the unprotected operations are all POSTs


def test_a_principal_that_changes_under_the_key_is_never_served_anothers_answer(
    alice: User, bob: User, alice_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Alice's session claims the key; the view authenticates Bob's token itself."""
    from rest_framework.authtoken.models import Token

    bobs_token = Token.objects.create(user=bob).key
    headers = {"Idempotency-Key": "shared", "X-Token": bobs_token}
    with caplog.at_level(logging.WARNING, "idempotency_django"):
        as_bob = alice_client.post("/plain/token-bookings/", headers=headers)
    assert as_bob.json()["owner"] == "bob"
    assert IdempotencyRecord.objects.count() == 0  # not kept under Alice's scope
    assert any("event=principal_changed" in r.getMessage() for r in caplog.records)
    as_alice = alice_client.post("/plain/token-bookings/", headers={"Idempotency-Key": "shared"})
    assert "Idempotency-Replayed" not in as_alice
    assert as_alice.json()["owner"] == "alice"  # hers, never Bob's answer
    again = alice_client.post("/plain/token-bookings/", headers={"Idempotency-Key": "shared"})
    assert again["Idempotency-Replayed"] == "true"
    assert again.content == as_alice.content


@pytest.mark.django_db(transaction=True)
def test_an_async_view_tells_an_anonymous_caller_too(settings: Any) -> None:
    """``arun`` lets the anonymous request through and marks it, middleware or not."""
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if m != "idempotency_django.middleware.IdempotencyMiddleware"
    ]
    answer = post(Client(), "/async/decorated/", key="async-anon")
    assert answer.status_code == 201
    assert answer[HEADER] == "anonymous"
