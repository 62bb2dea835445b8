"""Edges of the contract that the main tests pass by: odd keys, odd scopes, odd callers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import AnonymousUser, User
from django.test import AsyncClient, Client, RequestFactory, override_settings

from idempotency_django import idempotent
from idempotency_django.protocol.scope import default_scope, principal_of, session_scope
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

BODY = json.dumps({"slot": "2026-07-30T09:00:00Z"})


def post(client: Client, key: str, url: str = "/plain/bookings/", **extra: Any):  # type: ignore[no-untyped-def]
    return client.post(
        url, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key, **extra
    )


@pytest.mark.parametrize("key", ['"bad \\x escape"', '"ends with \\"', '"two" "keys"'])
def test_malformed_quoted_keys_are_refused(alice_client: Client, key: str) -> None:
    response = post(alice_client, key)
    assert response.status_code == 400
    assert response.json()["code"] == "idempotency_key_invalid"
    assert Booking.objects.count() == 0


def test_an_escaped_quote_is_part_of_the_key(alice_client: Client) -> None:
    assert post(alice_client, '"say \\"hi\\""').status_code == 201
    assert post(alice_client, '"say \\"hi\\""')["Idempotency-Replayed"] == "true"


def test_principals_need_a_saved_authenticated_user() -> None:
    assert principal_of(None) is None
    assert principal_of(AnonymousUser()) is None
    assert principal_of(User(username="unsaved")) is None  # no pk: never a shared scope


@override_settings(IDEMPOTENCY={"LOCATION_HEADER": None})
def test_locations_can_be_turned_off(alice: User) -> None:
    request = RequestFactory().post("/", HTTP_X_LOCATION_ID="portland")
    request.user = alice
    scope = default_scope(request)
    assert scope is not None and scope.location == ""


def test_session_scope_needs_a_session() -> None:
    assert session_scope(RequestFactory().post("/")) is None


def test_a_decorated_view_called_without_a_request_says_so() -> None:
    @idempotent
    def view(not_a_request: object) -> None: ...

    with pytest.raises(TypeError, match="without a request"):
        view(object())


@override_settings(IDEMPOTENCY={"PROBLEM_RENDERER": "tests.test_answers.typed_problem"})
def test_json_api_errors_link_to_the_problem_type(alice_client: Client) -> None:
    post(alice_client, "typed")
    reused = alice_client.post(
        "/plain/bookings/",
        "{}",
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="typed",
        HTTP_ACCEPT="application/vnd.api+json",
    )
    [error] = reused.json()["errors"]
    assert error["links"] == {"type": "https://docs.example.com/errors#idempotency_key_reused"}


@pytest.mark.django_db(transaction=True)
def test_an_async_view_that_raises_releases_its_key(alice: User) -> None:
    client = AsyncClient(raise_request_exception=False)
    client.force_login(alice)

    async def book(url: str):  # type: ignore[no-untyped-def]
        return await client.post(
            url, BODY, content_type="application/json", headers={"Idempotency-Key": "a-raise"}
        )

    assert async_to_sync(book)("/async/failing/?raise=1").status_code == 500
    # Released, not left reserved: the retry runs (and fails) again, no 409.
    assert async_to_sync(book)("/async/failing/?raise=1").status_code == 500
    assert Booking.objects.filter(slot="async-failing").count() == 2
