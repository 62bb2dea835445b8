"""The key contract on the DRF path: viewsets, actions, @api_view, mixin, principals."""

from __future__ import annotations

import base64
import json
import os
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from idempotency_django.models import IdempotencyRecord
from idempotency_django.testing import assert_idempotent
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

BODY = {"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"}


@pytest.fixture
def api(alice: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def create(  # type: ignore[no-untyped-def]
    client: APIClient | Client,
    url: str = "/api/bookings/",
    body: dict[str, Any] | None = None,
    key: str | None = "book-1",
    **headers: Any,
):
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(url, json.dumps(body or BODY), content_type="application/json", **headers)


def test_viewset_create_replays(api: APIClient) -> None:
    first = create(api, HTTP_X_LOCATION_ID="portland")
    assert first.status_code == 201
    assert first.json()["location"] == "portland"
    second = create(api, HTTP_X_LOCATION_ID="portland")
    assert second.status_code == 201
    assert second["Idempotency-Replayed"] == "true"
    assert second.content == first.content
    assert Booking.objects.count() == 1


def test_viewset_validation_error_is_not_retained(api: APIClient) -> None:
    bad = create(api, body={"customer": "no slot"})
    assert bad.status_code == 400
    assert IdempotencyRecord.objects.count() == 0
    fixed = create(api, body=BODY, key="book-1")
    assert fixed.status_code == 201


def test_viewset_reuse_and_update_destroy(api: APIClient) -> None:
    booking_id = create(api).json()["id"]
    assert create(api, body={**BODY, "slot": "other"}).json()["code"] == "idempotency_key_reused"
    url = f"/api/bookings/{booking_id}/"
    patch = api.patch(url, {"customer": "Dana W."}, format="json", HTTP_IDEMPOTENCY_KEY="patch-1")
    assert patch.status_code == 200
    again = api.patch(url, {"customer": "Dana W."}, format="json", HTTP_IDEMPOTENCY_KEY="patch-1")
    assert again["Idempotency-Replayed"] == "true"
    put = api.put(url, BODY, format="json", HTTP_IDEMPOTENCY_KEY="put-1")
    assert put.status_code == 200
    assert (
        api.put(url, BODY, format="json", HTTP_IDEMPOTENCY_KEY="put-1")["Idempotency-Replayed"]
        == "true"
    )
    delete = api.delete(url, HTTP_IDEMPOTENCY_KEY="delete-1")
    assert delete.status_code == 204
    replayed_delete = api.delete(url, HTTP_IDEMPOTENCY_KEY="delete-1")
    assert replayed_delete.status_code == 204
    assert replayed_delete["Idempotency-Replayed"] == "true"
    # Without the key the second delete is a plain 404.
    assert api.delete(url).status_code == 404


def test_custom_unsafe_action_is_protected(api: APIClient) -> None:
    booking_id = create(api).json()["id"]
    cancelled = assert_idempotent(api, "POST", f"/api/bookings/{booking_id}/cancel/")
    assert cancelled.status_code == 200
    assert Booking.objects.filter(slot__startswith="cancel-").count() == 1


def test_a_handler_routed_by_its_own_name_is_protected(api: APIClient) -> None:
    """The mixin protects whatever handler serves the unsafe method, whatever its name."""
    first = create(api, "/api/routed-book/", key="routed-1")
    assert first.status_code == 201
    again = create(api, "/api/routed-book/", key="routed-1")
    assert again["Idempotency-Replayed"] == "true"
    assert Booking.objects.filter(slot="routed").count() == 1


def test_exempt_action_is_not_protected(api: APIClient) -> None:
    api.post("/api/bookings/ping/", HTTP_IDEMPOTENCY_KEY="ping")
    api.post("/api/bookings/ping/", HTTP_IDEMPOTENCY_KEY="ping")
    assert Booking.objects.filter(slot="ping").count() == 2


def test_action_with_its_own_options(api: APIClient) -> None:
    missing = api.post("/api/bookings/strict/")
    assert missing.status_code == 400
    assert missing.json()["code"] == "idempotency_key_missing"
    assert api.post("/api/bookings/strict/", HTTP_IDEMPOTENCY_KEY="s").status_code == 201


def test_mixin_viewset_requires_a_key(api: APIClient) -> None:
    missing = create(api, url="/api/mixin-bookings/", key=None)
    assert missing.status_code == 400
    assert missing.json()["code"] == "idempotency_key_missing"
    assert assert_idempotent(api, "POST", "/api/mixin-bookings/", BODY).status_code == 201


def test_api_view_function(api: APIClient) -> None:
    assert assert_idempotent(api, "POST", "/api/book/", BODY).status_code == 201
    assert Booking.objects.count() == 1


def test_undecorated_drf_view_is_left_alone_by_middleware(api: APIClient) -> None:
    create(api, url="/api/unprotected-bookings/")
    create(api, url="/api/unprotected-bookings/")
    assert Booking.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 0


def test_unauthenticated_request_is_401_before_any_claim(client: Client) -> None:
    response = create(client)
    assert response.status_code in (401, 403)
    assert IdempotencyRecord.objects.count() == 0


def test_token_principals_never_see_each_other(alice: User, bob: User) -> None:
    alice_token, bob_token = Token.objects.create(user=alice), Token.objects.create(user=bob)
    client = Client()  # no session: the middleware sees AnonymousUser
    first = create(client, HTTP_AUTHORIZATION=f"Token {alice_token.key}")
    other = create(client, HTTP_AUTHORIZATION=f"Token {bob_token.key}")
    assert first.status_code == other.status_code == 201
    assert "Idempotency-Replayed" not in other
    assert other.json()["id"] != first.json()["id"]
    replay = create(client, HTTP_AUTHORIZATION=f"Token {alice_token.key}")
    assert replay["Idempotency-Replayed"] == "true"
    assert replay.json()["id"] == first.json()["id"]
    principals = set(IdempotencyRecord.objects.values_list("principal", flat=True))
    assert principals == {f"auth.user:{alice.pk}", f"auth.user:{bob.pk}"}


def test_a_token_request_is_answered_without_reading_the_session(
    alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed JSON body is read at once, whoever sent it: asking the session who did
    cost a fifth of the library's work per request and told caches the answer varies
    with the Cookie header (SessionMiddleware's Vary for a session that was read).
    The API takes tokens only here: DRF's SessionAuthentication would read it."""
    from rest_framework.authentication import TokenAuthentication

    from tests.testapp.views import BookingViewSet

    monkeypatch.setattr(BookingViewSet, "authentication_classes", [TokenAuthentication])
    token = Token.objects.create(user=alice)
    client = Client()
    first = create(client, HTTP_AUTHORIZATION=f"Token {token.key}")
    replay = create(client, HTTP_AUTHORIZATION=f"Token {token.key}")
    assert first.status_code == replay.status_code == 201
    assert replay["Idempotency-Replayed"] == "true"
    for response in (first, replay):
        assert "Cookie" not in response.get("Vary", ""), response.get("Vary")
        assert not response.wsgi_request.session.accessed
    assert Booking.objects.count() == 1


def test_basic_auth_principal(alice: User) -> None:
    client = Client()
    auth = "Basic " + base64.b64encode(b"alice:alice-password").decode()
    create(client, HTTP_AUTHORIZATION=auth)
    assert create(client, HTTP_AUTHORIZATION=auth)["Idempotency-Replayed"] == "true"


def test_session_auth_with_csrf(alice: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    refused = create(client)
    assert refused.status_code == 403  # DRF's CSRF check runs before any claim
    assert IdempotencyRecord.objects.count() == 0
    client.get("/admin/login/")  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    assert create(client, HTTP_X_CSRFTOKEN=token).status_code == 201
    assert create(client, HTTP_X_CSRFTOKEN=token)["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1


def test_multipart_body_is_fingerprinted(api: APIClient) -> None:
    first = api.post("/api/bookings/", {"slot": "s1"}, format="multipart", HTTP_IDEMPOTENCY_KEY="m")
    assert first.status_code == 201
    second = api.post(
        "/api/bookings/", {"slot": "s2"}, format="multipart", HTTP_IDEMPOTENCY_KEY="m"
    )
    assert second.json()["code"] == "idempotency_key_reused"


def test_decorating_an_api_view_result_is_refused() -> None:
    from rest_framework.decorators import api_view

    from idempotency_django import idempotent

    @api_view(["POST"])
    def view(request):  # type: ignore[no-untyped-def]
        return None

    with pytest.raises(TypeError, match="below @api_view"):
        idempotent(view)


def test_a_subclass_options_apply_to_its_inherited_handlers(api: APIClient) -> None:
    """StrictBookingViewSet(BookingViewSet) sets ViewOptions(required=True)."""
    missing = create(api, "/api/strict-bookings/", key=None)
    assert missing.status_code == 400
    assert missing.json()["code"] == "idempotency_key_missing"
    assert create(api, "/api/bookings/", key=None).status_code == 201  # the parent's stay
    assert create(api, "/api/strict-bookings/").status_code == 201
    assert create(api, "/api/strict-bookings/")["Idempotency-Replayed"] == "true"


def test_decorating_a_subclass_of_a_mixin_viewset(api: APIClient) -> None:
    """No MRO error at import, and the decorator's options replace the mixin's."""
    assert create(api, "/api/decorated-mixin-bookings/", key=None).status_code == 201
    assert create(api, "/api/decorated-mixin-bookings/").status_code == 201
    assert create(api, "/api/decorated-mixin-bookings/")["Idempotency-Replayed"] == "true"
    record = IdempotencyRecord.objects.get()
    assert record.completed_at is not None
    assert record.expires_at - record.completed_at == timedelta(seconds=60)


def test_the_protocol_reads_djangos_request_not_drfs_proxy(
    api: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DRF's ``Request`` hands an attribute on to Django's only after a failed lookup,
    about twenty times the cost of reading it there: a keyed request's first run and
    its replay read none through it (issue 36)."""
    from rest_framework.request import Request

    import idempotency_django

    package = os.path.dirname(idempotency_django.__file__)
    proxied = Request.__getattr__  # type: ignore[attr-defined]  # not in the stubs
    read_by_library: list[str] = []

    def spy(self: Request, attr: str) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith(package):
            read_by_library.append(f"{attr} in {os.path.basename(caller)}")
        return proxied(self, attr)

    monkeypatch.setattr(Request, "__getattr__", spy)
    assert create(api, HTTP_X_LOCATION_ID="portland").status_code == 201
    replay = create(api, HTTP_X_LOCATION_ID="portland")
    assert replay["Idempotency-Replayed"] == "true"
    assert read_by_library == []
