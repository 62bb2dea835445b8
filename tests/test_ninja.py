"""The django-ninja integration, through Django's test client (tests/testapp/ninja_api.py).

Keys are claimed after ninja's authentication and scoped by ``request.auth``:
bearer tokens, API keys, sessions and custom results. Real threads for the
concurrency claims; the store made unreachable for real (its table renamed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from uuid import UUID

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.http import HttpRequest
from django.test import Client, override_settings
from django.urls import path as route
from ninja import NinjaAPI, Router, Status
from ninja.decorators import decorate_view
from ninja.security import HttpBearer
from pydantic import ValidationError
from rest_framework.authtoken.models import Token

from idempotency_django.models import IdempotencyRecord
from idempotency_django.ninja import auth_principal, idempotent
from idempotency_django.ninja.scope import SECRET_PREFIX
from idempotency_django.protocol.scope import credential_digests
from tests.concurrency import in_threads
from tests.testapp import ninja_api
from tests.testapp.models import Booking

ROOT = Path(__file__).resolve().parent.parent


def post(
    client: Client,
    url: str,
    key: str | None = "key-1",
    slot: str = "a",
    token: str | None = None,
    **headers: str,
) -> Any:
    if key is not None:
        headers["Idempotency-Key"] = key
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return client.post(
        url, json.dumps({"slot": slot}), content_type="application/json", headers=headers
    )


def rows(**filters: Any) -> int:
    return Booking.objects.filter(**filters).count()


@pytest.fixture
def alice_token(alice: User) -> str:
    return str(Token.objects.create(user=alice).key)


@pytest.fixture
def bob_token(bob: User) -> str:
    return str(Token.objects.create(user=bob).key)


@pytest.fixture
def paused() -> Iterator[None]:
    ninja_api.PAUSED.clear()
    ninja_api.RELEASE.clear()
    try:
        yield
    finally:
        ninja_api.RELEASE.set()


@pytest.fixture
def without_middleware(settings: Any) -> None:
    """A project that protects its ninja API only (no IdempotencyMiddleware)."""
    settings.MIDDLEWARE = [
        name
        for name in settings.MIDDLEWARE
        if name != "idempotency_django.middleware.IdempotencyMiddleware"
    ]


# -- an API of this module's own (mounted under /own/ by the tests that use it) ----------


class TokenRowAuth(HttpBearer):
    """``Authorization: Bearer <DRF token key>``: the Token row itself, whose primary key
    is the bearer secret."""

    def authenticate(self, request: HttpRequest, token: str) -> Token | None:
        return Token.objects.filter(key=token).first()


own_api = NinjaAPI(urls_namespace="ninja-own", auth=ninja_api.BearerAuth())
own_api.add_decorator(idempotent(), mode="view")
own_router = Router()
own_router.add_decorator(idempotent(), mode="view")


@own_api.post("/token-row-bookings", auth=TokenRowAuth(), response={201: ninja_api.BookingOut})
def token_row_booking(request: HttpRequest, payload: ninja_api.BookingIn) -> Any:
    return Status(201, ninja_api.book(request, payload.slot))


@own_api.post("/strict", response={201: ninja_api.BookingOut})
@decorate_view(idempotent(required=True))  # the operation's own, as @idempotent(...) is
def strict_booking(request: HttpRequest, payload: ninja_api.BookingIn) -> Any:
    return Status(201, ninja_api.book(request, payload.slot))


@own_router.post("/strict", response={201: ninja_api.BookingOut})
@decorate_view(idempotent(required=True))
def router_strict_booking(request: HttpRequest, payload: ninja_api.BookingIn) -> Any:
    return Status(201, ninja_api.book(request, payload.slot))


own_api.add_router("/router", own_router)
own_urls = ModuleType("own_urls")
own_urls.urlpatterns = [route("own/", own_api.urls)]  # type: ignore[attr-defined]


# -- the contract, with each kind of ninja authentication -------------------------


@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore:Returning tuple:DeprecationWarning")  # ninja 1.7 on tuples
@pytest.mark.parametrize(
    "url", ["/ninja/bookings", "/ninja/tuple-bookings", "/ninja/async-bookings"]
)
def test_a_retry_replays_the_first_answer_and_runs_once(url: str, alice_token: str) -> None:
    client = Client()
    first = post(client, url, token=alice_token)
    again = post(client, url, token=alice_token)
    assert first.status_code == again.status_code == 201
    assert "Idempotency-Replayed" not in first
    assert again["Idempotency-Replayed"] == "true"
    assert again.content == first.content
    assert first.json()["customer"] == f"auth.user:{Token.objects.get(key=alice_token).user_id}"
    assert rows() == 1


@pytest.mark.django_db
def test_the_same_key_for_another_request_is_409_reused(alice_token: str) -> None:
    client = Client()
    assert post(client, "/ninja/bookings", slot="a", token=alice_token).status_code == 201
    reused = post(client, "/ninja/bookings", slot="b", token=alice_token)
    assert reused.status_code == 409
    assert reused["Content-Type"] == "application/problem+json"
    assert reused.json()["code"] == "idempotency_key_reused"
    assert rows() == 1


@pytest.mark.django_db
def test_each_bearer_principal_has_its_own_keys(alice_token: str, bob_token: str) -> None:
    client = Client()
    alices = post(client, "/ninja/bookings", token=alice_token)
    bobs = post(client, "/ninja/bookings", token=bob_token)
    assert alices.json()["id"] != bobs.json()["id"]
    assert post(client, "/ninja/bookings", token=alice_token).content == alices.content
    assert post(client, "/ninja/bookings", token=bob_token).content == bobs.content
    assert rows() == 2


@pytest.mark.django_db
def test_api_keys_scope_keys_and_are_never_stored() -> None:
    client = Client()
    one = post(client, "/ninja/key-bookings", **{"X-API-Key": "partner-one-key"})
    two = post(client, "/ninja/key-bookings", **{"X-API-Key": "partner-two-key"})
    assert one.status_code == two.status_code == 201
    assert one.json()["id"] != two.json()["id"]
    replay = post(client, "/ninja/key-bookings", **{"X-API-Key": "partner-one-key"})
    assert replay["Idempotency-Replayed"] == "true"
    assert replay.content == one.content
    principals = set(IdempotencyRecord.objects.values_list("principal", flat=True))
    assert len(principals) == 2
    assert all(p.startswith(SECRET_PREFIX) for p in principals)
    assert not any("partner" in p for p in principals)
    assert rows() == 2


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=own_urls)
def test_a_token_row_as_the_principal_keeps_the_bearer_secret_out_of_the_record(
    alice: User,
) -> None:
    """An auth that returns DRF's ``Token`` row, whose primary key is the bearer secret:
    its keys are the row's (a retry replays), and the record's principal, which the admin
    shows, is ``authtoken.token:`` and an HMAC of the key under ``SECRET_KEY``, never the
    secret itself."""
    secret = Token.objects.create(user=alice).key
    client = Client()
    first = post(client, "/own/token-row-bookings", token=secret)
    again = post(client, "/own/token-row-bookings", token=secret)
    assert first.status_code == 201
    assert again["Idempotency-Replayed"] == "true"
    assert again.content == first.content
    assert rows() == 1
    principal = IdempotencyRecord.objects.get().principal
    assert secret not in principal
    assert principal == "authtoken.token:" + credential_digests(secret)[0]


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=own_urls)
def test_a_token_rows_retry_after_a_secret_key_rotation_replays(alice: User) -> None:
    """The row's digest follows ``SECRET_KEY_FALLBACKS``, as a string credential's does."""
    secret = Token.objects.create(user=alice).key
    old_key, new_key = "the-old-secret-key-" + "x" * 40, "the-new-secret-key-" + "y" * 40
    with override_settings(SECRET_KEY=old_key):
        assert post(Client(), "/own/token-row-bookings", token=secret).status_code == 201
    with override_settings(SECRET_KEY=new_key, SECRET_KEY_FALLBACKS=[old_key]):
        again = post(Client(), "/own/token-row-bookings", token=secret)
    assert again["Idempotency-Replayed"] == "true"
    assert rows() == 1


@pytest.mark.django_db
def test_a_custom_result_names_its_principal() -> None:
    client = Client()
    first = post(client, "/ninja/partner-bookings", **{"X-Partner": "7"})
    other = post(client, "/ninja/partner-bookings", **{"X-Partner": "8"})
    assert first.json()["customer"] == "partner:7"
    assert other.json()["customer"] == "partner:8"
    assert post(client, "/ninja/partner-bookings", **{"X-Partner": "7"}).content == first.content
    assert set(IdempotencyRecord.objects.values_list("principal", flat=True)) == {
        "partner:7",
        "partner:8",
    }


@pytest.mark.django_db
def test_a_result_that_names_nobody_is_refused_before_anything_runs() -> None:
    client = Client()
    with pytest.raises(ImproperlyConfigured, match="idempotency_principal"):
        post(client, "/ninja/anything-bookings", **{"X-Anything": "yes"})
    assert rows() == 0
    assert not IdempotencyRecord.objects.exists()


def test_auth_principal_names() -> None:
    user = User(pk=3, username="c")
    assert auth_principal(user) == "auth.user:3"
    other = User(pk=3, username="c")
    other._state.db = "tenant"
    assert auth_principal(other) == "auth.user@tenant:3"
    booking = Booking(pk=5)  # a model that is not a user: named by its label and pk
    assert auth_principal(booking) == "testapp.booking:5"
    uuid = UUID("12345678-1234-5678-1234-567812345678")  # as a UUIDField pk holds one
    assert auth_principal(Booking(pk=uuid)) == f"testapp.booking:{uuid}"  # type: ignore[misc]
    token = Token(key="abc")  # any other pk may be a credential: its keyed digest
    assert auth_principal(token) == "authtoken.token:" + credential_digests("abc")[0]
    assert auth_principal("s3cret") == auth_principal(b"s3cret") != "s3cret"
    assert auth_principal(None) is None
    assert auth_principal(False) is None
    with pytest.raises(ImproperlyConfigured):
        auth_principal(True)


@pytest.mark.django_db
def test_an_unauthenticated_call_is_refused_by_ninja_and_stores_nothing() -> None:
    client = Client()
    refused = post(client, "/ninja/bookings", token="not-a-token")
    assert refused.status_code == 401
    assert refused.json() == {"detail": "Unauthorized"}
    assert post(client, "/ninja/required-bookings", key=None).status_code == 401
    assert rows() == 0
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
def test_sessions_scope_by_the_logged_in_user(alice: User, bob: User) -> None:
    alice_client, bob_client = Client(), Client()
    alice_client.force_login(alice)
    bob_client.force_login(bob)
    alices = post(alice_client, "/ninja/session-bookings")
    bobs = post(bob_client, "/ninja/session-bookings")
    assert alices.status_code == bobs.status_code == 201
    assert alices.json()["id"] != bobs.json()["id"]
    assert post(alice_client, "/ninja/session-bookings").content == alices.content
    assert rows() == 2
    assert post(Client(), "/ninja/session-bookings").status_code == 401


@pytest.mark.django_db
@pytest.mark.usefixtures("without_middleware")
def test_two_principals_sharing_one_cookie_jar_each_replay_their_own(
    alice: User, bob_token: str
) -> None:
    """Alice's session cookie rides along on Bob's bearer calls: Bob's key is Bob's."""
    jar = Client()
    jar.force_login(alice)
    bobs = post(jar, "/ninja/bookings", token=bob_token)
    alices = post(jar, "/ninja/session-bookings", key="key-session")
    assert bobs.json()["customer"].startswith("auth.user:")
    assert bobs.json()["customer"] != f"auth.user:{alice.pk}"
    assert alices.json()["customer"] == f"auth.user:{alice.pk}"
    # The same key and the same request on the bearer operation, as Alice (her
    # token) in the same jar: hers, not Bob's answer.
    alice_token = Token.objects.create(user=alice).key
    as_alice = post(jar, "/ninja/bookings", token=alice_token)
    assert as_alice.status_code == 201
    assert "Idempotency-Replayed" not in as_alice
    assert as_alice.json()["customer"] == f"auth.user:{alice.pk}"
    assert post(jar, "/ninja/bookings", token=bob_token).content == bobs.content
    assert post(jar, "/ninja/bookings", token=alice_token).content == as_alice.content
    assert rows() == 3


@pytest.mark.django_db
def test_with_the_middleware_a_bearer_call_is_not_scoped_by_the_session(
    alice: User, bob_token: str
) -> None:
    """The middleware leaves protected ninja operations to the integration."""
    jar = Client()
    jar.force_login(alice)
    bobs = post(jar, "/ninja/bookings", token=bob_token)
    alice_token = Token.objects.create(user=alice).key
    as_alice = post(jar, "/ninja/bookings", token=alice_token)
    assert "Idempotency-Replayed" not in as_alice
    assert as_alice.json()["customer"] == f"auth.user:{alice.pk}"
    assert bobs.json()["customer"] != as_alice.json()["customer"]


@pytest.mark.django_db
def test_the_middleware_leaves_an_operation_the_integration_does_not_protect_alone(
    alice: User, bob: User, bob_token: str
) -> None:
    """The middleware runs before ninja authenticates anyone: for an operation the
    integration does not protect it would claim the key under the session's user, store
    the bearer user's answer there, and replay it to the session alone, which ninja
    answers 401. It leaves the key unused instead, as check W043 says."""
    jar = Client()
    jar.force_login(alice)  # Alice's session rides along on Bob's bearer call
    bobs = post(jar, "/ninja/unprotected", token=bob_token)
    assert (bobs.status_code, bobs.json()["customer"]) == (201, f"auth.user:{bob.pk}")
    assert bobs["Idempotency-Key-Ignored"] == "unprotected"
    alices = post(jar, "/ninja/unprotected")  # her session only, no token
    assert "Idempotency-Replayed" not in alices
    assert alices.status_code == 401
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
def test_keys_are_scoped_per_location(alice_token: str) -> None:
    client = Client()
    here = post(client, "/ninja/bookings", token=alice_token, **{"X-Location-Id": "here"})
    there = post(client, "/ninja/bookings", token=alice_token, **{"X-Location-Id": "there"})
    assert here.json()["id"] != there.json()["id"]
    again = post(client, "/ninja/bookings", token=alice_token, **{"X-Location-Id": "here"})
    assert again.content == here.content
    assert rows() == 2


@pytest.mark.django_db
def test_a_required_key_is_asked_for_after_authentication(alice_token: str) -> None:
    client = Client()
    missing = post(client, "/ninja/required-bookings", key=None, token=alice_token)
    assert missing.status_code == 400
    assert missing.json()["code"] == "idempotency_key_missing"
    assert post(client, "/ninja/required-bookings", token=alice_token).status_code == 201
    # Optional elsewhere: no key, no protection.
    assert post(client, "/ninja/bookings", key=None, token=alice_token).status_code == 201
    assert post(client, "/ninja/bookings", key=None, token=alice_token).status_code == 201
    assert rows() == 3


@pytest.mark.django_db
def test_a_malformed_key_is_400(alice_token: str) -> None:
    refused = post(Client(), "/ninja/bookings", key="x" * 300, token=alice_token)
    assert refused.status_code == 400
    assert refused.json()["code"] == "idempotency_key_invalid"
    assert rows() == 0


@pytest.mark.django_db
def test_headers_set_on_ninjas_response_are_replayed(alice_token: str, settings: Any) -> None:
    settings.IDEMPOTENCY = {"REPLAY_HEADERS": ["Content-Type", "Location"]}
    client = Client()
    first = post(client, "/ninja/headers", token=alice_token)
    again = post(client, "/ninja/headers", token=alice_token)
    assert first["Location"] == again["Location"] == "/bookings/1"
    assert again["Idempotency-Replayed"] == "true"
    assert rows() == 1


# -- failures: 5xx, errors, results ninja cannot serialize, the store down ---------


@pytest.mark.django_db(transaction=True)
def test_a_5xx_is_not_kept_and_its_work_rolls_back(alice_token: str) -> None:
    client = Client()
    for _ in range(2):
        failed = post(client, "/ninja/atomic-failing", token=alice_token)
        assert failed.status_code == 503
        assert "Idempotency-Replayed" not in failed
    assert rows() == 0
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_ninja_http_error_is_answered_and_its_work_rolls_back(alice_token: str) -> None:
    client = Client()
    for _ in range(2):
        refused = post(client, "/ninja/http-error", token=alice_token)
        assert refused.status_code == 409
        assert refused.json() == {"detail": "slot taken"}
        assert "Idempotency-Replayed" not in refused  # a 4xx is not kept: the retry runs
    assert rows() == 0


@pytest.mark.django_db(transaction=True)
def test_a_result_ninja_cannot_serialize_strands_no_key_and_commits_nothing(
    alice_token: str,
) -> None:
    client = Client()
    for _ in range(2):  # the retry runs again: no 409 in progress, no replay
        with pytest.raises(ValidationError):
            post(client, "/ninja/unserializable", token=alice_token)
    assert rows() == 0
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("url", ["/ninja/unserializable-plain", "/ninja/async-unserializable"])
def test_without_a_transaction_an_unserializable_result_still_strands_no_key(
    url: str, alice_token: str
) -> None:
    """Its writes are committed (as in any view that fails after writing), its key is free."""
    client = Client()
    for _ in range(2):
        with pytest.raises(ValidationError):
            post(client, url, token=alice_token)
    assert rows() == 2  # the retry ran: no 409 in progress, no replay
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("url", ["/ninja/bookings", "/ninja/async-bookings"])
def test_the_store_down_is_503_and_nothing_runs(url: str, alice_token: str) -> None:
    table = IdempotencyRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {table}_gone")
    try:
        response = post(Client(), url, token=alice_token)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table}_gone RENAME TO {table}")
    assert response.status_code == 503
    assert response.json()["code"] == "idempotency_unavailable"
    assert rows() == 0


# -- concurrency: real threads -----------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("paused")
@pytest.mark.parametrize("url", ["/ninja/paused", "/ninja/async-paused"])
def test_a_duplicate_while_the_first_runs_is_409_in_progress(url: str, alice_token: str) -> None:
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(post(Client(), url, token=alice_token)))
    first.start()
    try:
        assert ninja_api.PAUSED.wait(10)
        duplicate = post(Client(), url, token=alice_token)
        assert duplicate.status_code == 409
        assert duplicate.json()["code"] == "idempotency_key_in_progress"
        assert duplicate["Retry-After"]
    finally:
        ninja_api.RELEASE.set()
        first.join(10)
    assert results[0].status_code == 201
    replay = post(Client(), url, token=alice_token)
    assert replay["Idempotency-Replayed"] == "true"
    assert replay.content == results[0].content
    assert rows() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("paused")
def test_a_duplicate_waits_for_the_first_and_gets_its_answer(alice_token: str) -> None:
    results: list[Any] = []
    url = "/ninja/paused-waited"
    first = threading.Thread(target=lambda: results.append(post(Client(), url, token=alice_token)))
    first.start()
    assert ninja_api.PAUSED.wait(10)
    waited: list[Any] = []
    duplicate = threading.Thread(
        target=lambda: waited.append(post(Client(), url, token=alice_token))
    )
    duplicate.start()
    duplicate.join(0.5)
    assert duplicate.is_alive()  # waiting, not answered 409
    ninja_api.RELEASE.set()
    first.join(10)
    duplicate.join(10)
    assert waited[0].status_code == 201
    assert waited[0]["Idempotency-Replayed"] == "true"
    assert waited[0].content == results[0].content
    assert rows() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "url", ["/ninja/bookings", "/ninja/async-bookings", "/ninja/router/bookings"]
)
def test_concurrent_retries_run_the_work_once(url: str, alice_token: str) -> None:
    responses = in_threads(8, lambda i: post(Client(), url, token=alice_token))
    assert not [r for r in responses if isinstance(r, BaseException)], responses
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) <= {201, 409}
    assert 201 in statuses
    assert rows() == 1


# -- routers and whole APIs ---------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "/ninja/router/bookings",
        "/ninja/router/async-bookings",
        "/ninja-whole/bookings",
        "/ninja-whole/shared/bookings",
    ],
)
def test_a_protected_router_or_api_protects_its_operations(url: str, alice_token: str) -> None:
    client = Client()
    first = post(client, url, token=alice_token)
    again = post(client, url, token=alice_token)
    assert first.status_code == 201
    assert again["Idempotency-Replayed"] == "true"
    assert again.content == first.content
    assert rows() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("prefix", ["/ninja/router", "/ninja-whole/shared"])
def test_an_operations_own_options_win_over_its_routers(prefix: str, alice_token: str) -> None:
    missing = post(Client(), f"{prefix}/required", key=None, token=alice_token)
    assert missing.status_code == 400
    assert missing.json()["code"] == "idempotency_key_missing"


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=own_urls)
@pytest.mark.parametrize("url", ["/own/strict", "/own/router/strict"])
def test_an_operations_own_options_given_by_decorate_view_win_over_its_routers(
    url: str, alice_token: str
) -> None:
    """``@decorate_view(idempotent(required=True))`` is the operation's own protection, as
    ``@idempotent(required=True)`` below its route is: under a protected API (and router),
    a request without a key is ``400 idempotency_key_missing`` and books nothing, and the
    schema says the header is required."""
    missing = post(Client(), url, key=None, token=alice_token)
    assert missing.status_code == 400
    assert missing.json()["code"] == "idempotency_key_missing"
    assert rows() == 0
    operation = own_api.get_openapi_schema(path_prefix="")["paths"][url.removeprefix("/own")]
    (key,) = [p for p in operation["post"]["parameters"] if p["name"] == "Idempotency-Key"]
    assert key["required"] is True


@pytest.mark.django_db
def test_an_exempt_operation_of_a_protected_router_runs_each_time(alice_token: str) -> None:
    client = Client()
    for _ in range(2):
        answer = post(client, "/ninja/router/exempt", token=alice_token)
        assert answer.status_code == 201
        assert "Idempotency-Replayed" not in answer
    assert rows() == 2


@pytest.mark.django_db
def test_an_unprotected_operation_is_left_alone(alice_token: str) -> None:
    client = Client()
    assert post(client, "/ninja/unprotected", token=alice_token).status_code == 201
    assert "Idempotency-Replayed" not in post(client, "/ninja/unprotected", token=alice_token)
    assert rows() == 2


def test_applied_where_it_would_run_before_authentication_it_refuses() -> None:
    api = NinjaAPI(urls_namespace="misplaced")
    with pytest.raises(TypeError, match="below"):

        @idempotent
        @api.post("/x")
        def above(request: HttpRequest) -> dict[str, str]:
            return {}

    router = Router()
    router.add_decorator(idempotent())  # mode="operation", ninja's default

    @router.post("/y")
    def operation_mode(request: HttpRequest) -> dict[str, str]:
        return {}

    other = NinjaAPI(urls_namespace="misplaced-router")
    other.add_router("/r", router)
    with pytest.raises(TypeError, match="mode='view'"):
        other.urls  # noqa: B018  (binding applies the decorators)


def test_an_async_operation_is_protected_async_when_ninja_makes_it() -> None:
    """ninja sets ``is_async`` only after the operation's callbacks ran (ninja 1.3 binds
    that very operation; later versions protect a copy too): the protection must be async."""
    from asgiref.sync import iscoroutinefunction
    from ninja.operation import PathView

    async def create(request: HttpRequest) -> dict[str, str]:
        return {}

    path_view = PathView()
    operation = path_view.add_operation("/c", ["POST"], idempotent(create))
    assert iscoroutinefunction(operation.view_func)
    assert iscoroutinefunction(operation.run)


# -- the OpenAPI schema --------------------------------------------------------------


def operation_schema(api: NinjaAPI, path: str) -> dict[str, Any]:
    schema = api.get_openapi_schema()
    operation: dict[str, Any] = schema["paths"][path]["post"]
    return operation


def test_the_schema_documents_the_key_and_the_answers() -> None:
    operation = operation_schema(ninja_api.api, "/ninja/bookings")
    (key,) = [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
    assert key["in"] == "header"
    assert key["required"] is False
    assert key["schema"]["maxLength"] == 255
    responses = operation["responses"]
    assert set(responses) == {201, 400, 409, 413, 503}
    assert "Idempotency-Replayed" in responses[201]["headers"]
    assert "BookingOut" in responses[201]["content"]["application/json"]["schema"]["$ref"]
    assert set(responses[409]["content"]["application/problem+json"]["examples"]) == {
        "idempotency_key_reused",
        "idempotency_key_in_progress",
        "idempotency_response_not_stored",
    }
    assert "Retry-After" in responses[503]["headers"]
    required = operation_schema(ninja_api.api, "/ninja/required-bookings")
    assert required["parameters"][0]["required"] is True
    assert (
        "idempotency_key_missing"
        in (required["responses"][400]["content"]["application/problem+json"]["examples"])
    )


def test_the_schema_leaves_unprotected_and_exempt_operations_alone() -> None:
    for path in ("/ninja/unprotected", "/ninja/router/exempt"):
        operation = operation_schema(ninja_api.api, path)
        assert not [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
        assert set(operation["responses"]) == {201}


def test_the_schema_shows_the_reuse_status_of_the_settings() -> None:
    with override_settings(IDEMPOTENCY={"REUSE_STATUS": 422}):
        api = NinjaAPI(urls_namespace="reuse-422")

        @api.post("/z", response={201: dict})
        @idempotent
        def create(request: HttpRequest) -> Any:
            return 201, {}

        responses = api.get_openapi_schema(path_prefix="")["paths"]["/z"]["post"]["responses"]
    assert set(responses) == {201, 400, 409, 413, 422, 503}
    assert set(responses[422]["content"]["application/problem+json"]["examples"]) == {
        "idempotency_key_reused"
    }


def test_a_second_mount_documents_the_key_once() -> None:
    operation = operation_schema(ninja_api.whole_api, "/ninja-whole/shared/bookings")
    assert [p["name"] for p in operation["parameters"]].count("Idempotency-Key") == 1


# -- packaging ------------------------------------------------------------------------


def test_the_package_imports_without_ninja() -> None:
    code = (
        "import sys; sys.modules['ninja'] = None\n"
        "import django; from django.conf import settings\n"
        "settings.configure(INSTALLED_APPS=['django.contrib.auth', "
        "'django.contrib.contenttypes', 'idempotency_django'])\n"
        "django.setup()\n"
        "import idempotency_django.middleware, idempotency_django.decorators\n"
        "import idempotency_django.protocol.marks, idempotency_django.protocol.openapi_contract\n"
        "try:\n    import idempotency_django.ninja\nexcept ImportError:\n    print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_duplicate_window_answers_a_keyless_retry_by_the_same_principal(
    alice_token: str, bob_token: str
) -> None:
    """``window=`` on a ninja operation: scoped by ninja's ``request.auth``, not the session."""
    client = Client()
    first = post(client, "/ninja/windowed-bookings", key=None, token=alice_token)
    again = post(client, "/ninja/windowed-bookings", key=None, token=alice_token)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.content == first.content
    assert again["Idempotency-Replayed"] == "true" and again["Idempotency-Window"] == "2"
    bobs = post(client, "/ninja/windowed-bookings", key=None, token=bob_token)
    other = post(client, "/ninja/windowed-bookings", key=None, slot="b", token=alice_token)
    assert "Idempotency-Replayed" not in bobs and "Idempotency-Replayed" not in other
    assert rows() == 3
