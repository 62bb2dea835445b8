"""Per-view fingerprint and scope, and guests scoped by their session."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings

from idempotency_django.models import IdempotencyRecord
from idempotency_django.protocol.fingerprint import (
    default_fingerprint,
    ignore_json_fields,
    json_fields,
)
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db


def post(client: Client, url: str, payload: dict[str, Any], key: str = "k", **headers: Any):  # type: ignore[no-untyped-def]
    return client.post(
        url,
        json.dumps(payload),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key,
        **headers,
    )


def test_json_fields_compare_only_the_named_fields(alice_client: Client) -> None:
    first = post(alice_client, "/plain/slot/", {"slot": "9:00", "customer": "Dana", "at": 1})
    assert first.status_code == 201
    # Another client timestamp, the keys in another order: the same request.
    retry = post(alice_client, "/plain/slot/", {"at": 2, "customer": "Dana", "slot": "9:00"})
    assert retry["Idempotency-Replayed"] == "true"
    other = post(alice_client, "/plain/slot/", {"slot": "10:00", "customer": "Dana", "at": 1})
    assert other.json()["code"] == "idempotency_key_reused"
    assert Booking.objects.count() == 1


def test_ignored_json_fields_do_not_count(alice_client: Client) -> None:
    assert post(alice_client, "/plain/nonce/", {"slot": "a", "nonce": "x1"}).status_code == 201
    retry = post(alice_client, "/plain/nonce/", {"slot": "a", "nonce": "x2", "sent_at": 5})
    assert retry["Idempotency-Replayed"] == "true"
    assert post(alice_client, "/plain/nonce/", {"slot": "b", "nonce": "x3"}).status_code == 409
    assert Booking.objects.count() == 1


def test_a_body_nested_too_deep_for_the_json_parser_is_compared_byte_for_byte() -> None:
    """``json.loads`` raises RecursionError, not ValueError, on it: was a 500."""
    from django.test import RequestFactory

    nested = b"[" * 100_000 + b"]" * 100_000
    request = RequestFactory().post("/plain/slot/", nested, content_type="application/json")
    assert json_fields("slot")(request) == default_fingerprint(request)


def test_a_body_that_is_not_a_json_object_is_compared_byte_for_byte(alice_client: Client) -> None:
    """The helpers never make two different non-JSON bodies "the same"."""
    fingerprint = json_fields("slot")
    from django.test import RequestFactory

    def request(body: bytes):  # type: ignore[no-untyped-def]
        return RequestFactory().post("/plain/slot/", body, content_type="text/plain")

    assert fingerprint(request(b"a")) == default_fingerprint(request(b"a"))
    assert fingerprint(request(b"a")) != fingerprint(request(b"b"))
    assert fingerprint(request(b"[1]")) != fingerprint(request(b"[2]"))


def test_the_helpers_need_field_names() -> None:
    with pytest.raises(ValueError):
        json_fields()
    with pytest.raises(ValueError):
        ignore_json_fields()
    assert repr(json_fields("a", "b")) == "json_fields('a', 'b')"


def test_a_view_with_its_own_scope(alice_client: Client, bob_client: Client) -> None:
    """Scoped by organisation: a teammate's retry replays; another organisation's is its own."""
    first = post(alice_client, "/plain/organisation/", {}, HTTP_X_ORGANISATION="acme")
    assert first.status_code == 201
    teammate = post(bob_client, "/plain/organisation/", {}, HTTP_X_ORGANISATION="acme")
    assert teammate["Idempotency-Replayed"] == "true"
    other = post(bob_client, "/plain/organisation/", {}, HTTP_X_ORGANISATION="globex")
    assert other.status_code == 201 and "Idempotency-Replayed" not in other
    assert Booking.objects.count() == 2


def guest_post(client: Client, slot: str = "guest", key: str = "guest-1"):  # type: ignore[no-untyped-def]
    return client.post("/plain/guest/", {"slot": slot}, HTTP_IDEMPOTENCY_KEY=key)


@override_settings(IDEMPOTENCY={"ANONYMOUS": "session"})
def test_a_guest_is_scoped_by_a_session_started_for_the_first_request() -> None:
    guest = Client()
    first = guest_post(guest)
    assert first.status_code == 201
    assert settings.SESSION_COOKIE_NAME in first.cookies  # the session it now belongs to
    assert guest_post(guest)["Idempotency-Replayed"] == "true"
    # Another guest (another session) with the same key runs its own request.
    stranger = guest_post(Client())
    assert stranger.status_code == 201 and "Idempotency-Replayed" not in stranger
    assert Booking.objects.count() == 2
    principals = set(IdempotencyRecord.objects.values_list("principal", flat=True))
    assert len(principals) == 2 and all(p.startswith("session:") for p in principals)
    session_key = guest.cookies[settings.SESSION_COOKIE_NAME].value
    assert not any(session_key in p for p in principals)  # a digest, never the session key


def test_guests_run_unprotected_by_default() -> None:
    guest = Client()
    assert guest_post(guest).status_code == 201
    assert "Idempotency-Replayed" not in guest_post(guest)
    assert Booking.objects.count() == 2


def test_session_scoping_needs_session_middleware() -> None:
    from idempotency_django.checks import check_middleware

    middleware = [m for m in settings.MIDDLEWARE if "SessionMiddleware" not in m]
    with override_settings(IDEMPOTENCY={"ANONYMOUS": "session"}, MIDDLEWARE=middleware):
        assert "idempotency_django.E014" in {m.id for m in check_middleware()}
    with override_settings(IDEMPOTENCY={"ANONYMOUS": "session"}):
        assert check_middleware() == []


def test_openapi_says_which_fields_count(alice: User) -> None:
    pytest.importorskip("drf_spectacular")
    from tests.test_openapi import build_schema, key_header

    schema = build_schema()
    by_slot = key_header(schema["paths"]["/api/slot/"]["post"])
    assert by_slot is not None and "JSON body's fields `slot`" in by_slot["description"]
    default = key_header(schema["paths"]["/api/bookings/"]["post"])
    assert default is not None and "exact body bytes" in default["description"]
