"""One protocol, every door: each behaviour the doors share, through each of them.

Each door runs the same work (``_act``): a booking per run, then the answer the request
body asks for. The doors: ``IdempotencyMiddleware`` on a plain view (sync and async),
``@idempotent`` on a function (sync and async) and on a class, DRF's ``IdempotentMixin``
(and with ``raise_idempotency_errors``), ``@api_view`` with ``@idempotent``, the
django-ninja integration (sync and async, ``django_auth``), and a GraphQL mutation. A
door that differs from the others where the docs say nothing of it is a defect: a fix to
the protocol must be a fix everywhere. Through the real middleware stack.
"""

from __future__ import annotations

import json
import logging
from types import ModuleType
from typing import Any

import pytest
import strawberry
from django.contrib.auth import login
from django.contrib.auth.models import User
from django.db import transaction
from django.http import Http404, HttpRequest, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from django.views import View
from ninja import NinjaAPI
from ninja.errors import HttpError
from ninja.security import django_auth
from rest_framework.decorators import api_view
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView
from strawberry.django.views import GraphQLView

from idempotency_django import idempotency_exempt, idempotent
from idempotency_django.drf import IdempotentMixin
from idempotency_django.graphql import Idempotent
from idempotency_django.models import IdempotencyRecord
from idempotency_django.ninja import idempotent as ninja_idempotent
from tests.redis_helpers import DOWN_ALIAS, redis_store_settings
from tests.testapp.models import Booking


def _act(request: HttpRequest, body: bytes) -> tuple[int, dict[str, Any]] | str:
    """The work: one booking, then what the body asks for. A str: raise a 404 the door's way."""
    do = json.loads(body or b"{}").get("do", "ok")
    Booking.objects.create(slot=do)
    if do == "raise404":
        return "raise404"
    if do == "login_bob":
        bob = User.objects.get(username="bob")
        login(request, bob, backend="django.contrib.auth.backends.ModelBackend")
        return 200, {"hello": "bob"}
    if do == "rollback":
        transaction.set_rollback(True)
        return 201, {"rolled": True}
    if do == "422":
        return 422, {"detail": "no"}
    return 201, {"id": Booking.objects.count()}


# -- the doors -------------------------------------------------------------------


def plain_view(request: HttpRequest) -> JsonResponse:
    result = _act(request, request.body)
    if isinstance(result, str):
        raise Http404("gone")
    return JsonResponse(result[1], status=result[0])


async def plain_async_view(request: HttpRequest) -> JsonResponse:
    from asgiref.sync import sync_to_async

    result = await sync_to_async(_act)(request, request.body)
    if isinstance(result, str):
        raise Http404("gone")
    return JsonResponse(result[1], status=result[0])


decorated_view = idempotent(plain_view)
decorated_atomic_view = idempotent(atomic=True)(plain_view)
decorated_async_view = idempotent(plain_async_view)


@idempotent
class DecoratedCBV(View):
    def post(self, request: HttpRequest) -> JsonResponse:
        return plain_view(request)


class MixinView(IdempotentMixin, APIView):
    def post(self, request: Any) -> Response:
        result = _act(request, request.body)
        if isinstance(result, str):
            raise NotFound("gone")
        return Response(result[1], status=result[0])


class AtomicMixinView(MixinView):
    from idempotency_django.protocol.options import ViewOptions

    idempotency_options = ViewOptions(atomic=True)


class RaisingMixinView(MixinView):
    raise_idempotency_errors = True


@api_view(["POST"])
@idempotent
def api_view_door(request: Any) -> Response:
    result = _act(request, request.body)
    if isinstance(result, str):
        raise NotFound("gone")
    return Response(result[1], status=result[0])


doors_api = NinjaAPI(urls_namespace="doors", auth=django_auth)


@doors_api.post("/sync")
@ninja_idempotent
def ninja_sync(request: HttpRequest) -> Any:
    return _ninja(request)


@doors_api.post("/atomic")
@ninja_idempotent(atomic=True)
def ninja_atomic(request: HttpRequest) -> Any:
    return _ninja(request)


def _ninja(request: HttpRequest) -> Any:
    result = _act(request, request.body)
    if isinstance(result, str):
        raise HttpError(404, "gone")
    return JsonResponse(result[1], status=result[0])


@doors_api.post("/async")
@ninja_idempotent
async def ninja_async(request: HttpRequest) -> Any:
    from asgiref.sync import sync_to_async

    return await sync_to_async(_ninja)(request)


# -- GraphQL --


@strawberry.type
class Out:
    id: int
    customer: str


@strawberry.type
class GraphQLQuery:
    @strawberry.field
    def n(self) -> int:
        return 0


def protected_mutation(resolver: Any) -> Any:
    """``@strawberry.mutation(extensions=[Idempotent()])``, which mypy sees as untyped."""
    return strawberry.mutation(resolver, extensions=[Idempotent()])


@strawberry.type
class GraphQLMutation:
    @protected_mutation
    def act(self, info: strawberry.Info, do: str) -> Out:
        request = info.context.request
        booking = Booking.objects.create(slot=do)
        if do == "login_bob":
            bob = User.objects.get(username="bob")
            login(request, bob, backend="django.contrib.auth.backends.ModelBackend")
        return Out(id=booking.pk, customer=request.user.username)


graphql_schema = strawberry.Schema(query=GraphQLQuery, mutation=GraphQLMutation)


urls = ModuleType("doors_urls")
urls.urlpatterns = [  # type: ignore[attr-defined]
    path("m/", plain_view),
    path("m-async/", plain_async_view),
    path("d/", decorated_view),
    path("d-atomic/", decorated_atomic_view),
    path("d-async/", decorated_async_view),
    path("cbv/", DecoratedCBV.as_view()),
    path("drf/", MixinView.as_view()),
    path("drf-atomic/", AtomicMixinView.as_view()),
    path("api-view/", api_view_door),
    path("drf-raising/", RaisingMixinView.as_view()),
    path("n/", doors_api.urls),
    path("graphql/", idempotency_exempt(GraphQLView.as_view(schema=graphql_schema))),
]

SYNC_DOORS = ["/m/", "/d/", "/cbv/", "/drf/", "/api-view/", "/n/sync"]
ALL_DOORS = [*SYNC_DOORS, "/m-async/", "/d-async/", "/n/async"]


def send(client: Client, where: str, do: str, key: str = "k-1") -> Any:
    return client.post(
        where,
        json.dumps({"do": do}),
        content_type="application/json",
        headers={"Idempotency-Key": key},
    )


def runs(do: str) -> int:
    return Booking.objects.filter(slot=do).count()


# -- 1. principal_changed: the view logs someone else in ---------------------------------


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls)
@pytest.mark.parametrize("where", [*SYNC_DOORS, "/m-async/", "/d-async/"])
def test_a_view_that_logs_someone_else_in_gives_the_key_back(
    alice_client: Client, bob: User, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """docs/guarantees.md: "A principal that changes while the key is held (a request
    claimed for its session's user whose view then authenticates someone else) is never
    stored under the first principal: the key is given back and principal_changed is
    logged." """
    with caplog.at_level(logging.INFO, logger="idempotency_django"):
        answer = send(alice_client, where, "login_bob")
    assert answer.status_code == 200
    events = [r.idempotency["event"] for r in caplog.records if hasattr(r, "idempotency")]
    assert "principal_changed" in events, events
    assert not IdempotencyRecord.objects.filter(state="completed").exists()


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls)
@pytest.mark.parametrize("where", ["/m/", "/d/", "/drf/", "/n/sync"])
def test_the_answer_of_a_view_that_logged_someone_else_in_is_not_replayed_to_the_first(
    alice: User, bob: User, where: str
) -> None:
    """The reason release_reason gives: stored under the first principal, the answer made
    after bob was logged in would be served to alice's retry."""
    first_client = Client()
    first_client.force_login(alice)
    first = send(first_client, where, "login_bob")
    retry_client = Client()  # alice again, from a jar the login did not change
    retry_client.force_login(alice)
    retry = send(retry_client, where, "login_bob")
    assert first.status_code == 200
    assert retry.get("Idempotency-Replayed") is None, retry.content
    assert runs("login_bob") == 2


# -- 2. IDEMPOTENCY["ATOMIC"]: a view that writes, then raises an exception answered 4xx ----


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=urls, IDEMPOTENCY={"ATOMIC": True})
@pytest.mark.parametrize("where", SYNC_DOORS)
def test_under_atomic_a_404_raised_after_a_write_rolls_the_write_back(
    alice_client: Client, where: str
) -> None:
    """ATOMIC: "every protected view runs in a transaction that also stores its response,
    so the two commit together"; an exception: "the key is released". The work must go with
    the released key, or the retry (which the release invites) books it again."""
    first = send(alice_client, where, "raise404")
    retry = send(alice_client, where, "raise404")
    assert (first.status_code, retry.status_code) == (404, 404)
    assert runs("raise404") == 0, f"{runs('raise404')} bookings committed under released keys"


# -- where the doors agree ------------------------------------------------------------------

RETAIN_4XX = {"RETAIN_FUNCTION": "idempotency_django.protocol.retention.retain_client_errors"}


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls, IDEMPOTENCY=RETAIN_4XX)
@pytest.mark.parametrize("where", ALL_DOORS)
def test_agree_a_returned_422_is_kept_under_retain_client_errors(
    alice_client: Client, where: str
) -> None:
    first, retry = send(alice_client, where, "422"), send(alice_client, where, "422")
    assert (first.status_code, retry.status_code) == (422, 422)
    assert retry.get("Idempotency-Replayed") == "true"
    assert runs("422") == 1


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls)
@pytest.mark.parametrize("where", ALL_DOORS)
def test_agree_a_returned_422_is_released_by_default(alice_client: Client, where: str) -> None:
    first, retry = send(alice_client, where, "422"), send(alice_client, where, "422")
    assert (first.status_code, retry.status_code) == (422, 422)
    assert retry.get("Idempotency-Replayed") is None
    assert runs("422") == 2


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls)
@pytest.mark.parametrize("where", ALL_DOORS)
def test_agree_one_info_record_per_keyed_request(
    alice_client: Client, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    def infos(*args: Any, **kwargs: Any) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="idempotency_django"):
            send(alice_client, where, *args, **kwargs)
        return [
            r.idempotency["event"]
            for r in caplog.records
            if r.levelno == logging.INFO and hasattr(r, "idempotency")
        ]

    assert infos("ok") == ["stored"]
    assert infos("ok") == ["replayed"]
    assert infos("other") == ["conflict"]
    assert infos("422", key="k-2") == ["released"]
    assert infos("ok", key="bad,key") == ["rejected"]


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls)
@pytest.mark.parametrize("where", ALL_DOORS)
def test_agree_anonymous_is_marked_and_runs(client: Client, where: str) -> None:
    if where.startswith("/n/") or where in ("/drf/", "/api-view/"):
        pytest.skip("authenticated inside: 401/403 first")
    answer = send(client, where, "ok")
    assert answer.get("Idempotency-Key-Ignored") == "anonymous"


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls)
@pytest.mark.parametrize("where", ALL_DOORS)
def test_agree_location_too_long(alice_client: Client, where: str) -> None:
    answer = alice_client.post(
        where,
        json.dumps({"do": "ok"}),
        content_type="application/json",
        headers={"Idempotency-Key": "k", "X-Location-Id": "x" * 256},
    )
    assert answer.status_code == 400 and answer.json()["code"] == "idempotency_location_invalid"
    assert runs("ok") == 0


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=urls, IDEMPOTENCY={"ATOMIC": True})
@pytest.mark.parametrize("where", SYNC_DOORS)
def test_agree_set_rollback_under_atomic_is_not_replayed(alice_client: Client, where: str) -> None:
    first, retry = send(alice_client, where, "rollback"), send(alice_client, where, "rollback")
    assert (first.status_code, retry.status_code) == (201, 201)
    assert retry.get("Idempotency-Replayed") is None
    assert runs("rollback") == 0


# -- 4. MAX_FINGERPRINTED_BODY: "once it has a principal (an anonymous one gets its 401 or
#       403 first)" ---------------------------------------------------------------------------


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls, IDEMPOTENCY={"MAX_FINGERPRINTED_BODY": 16})
@pytest.mark.parametrize(
    ("where", "refused"), [("/drf/", 403), ("/api-view/", 403), ("/n/sync", 401), ("/n/async", 401)]
)
def test_an_unauthenticated_large_body_gets_its_401_or_403_first(
    client: Client, where: str, refused: int
) -> None:
    answer = client.post(
        where,
        json.dumps({"do": "ok", "padding": "x" * 64}),
        content_type="application/json",
        headers={"Idempotency-Key": "big-1"},
    )
    assert answer.status_code == refused, (answer.status_code, answer.content)


# -- 5. MARKER_HEADERS["KEY_ECHO"]: "on every answer to a keyed request (the view's
#       response, a replay, a conflict)" ------------------------------------------------------


@pytest.mark.django_db
@override_settings(
    ROOT_URLCONF=urls, IDEMPOTENCY={"MARKER_HEADERS": {"KEY_ECHO": "Idempotency-Key"}}
)
@pytest.mark.parametrize("where", [*ALL_DOORS, "/drf-raising/"])
def test_the_key_is_echoed_on_every_answer(alice_client: Client, where: str) -> None:
    """Also where DRF's ``EXCEPTION_HANDLER`` renders the refusal (it lost the header)."""
    first = send(alice_client, where, "ok")
    replay = send(alice_client, where, "ok")
    conflict = send(alice_client, where, "other")
    assert conflict.status_code == 409
    assert [a.get("Idempotency-Key") for a in (first, replay, conflict)] == ["k-1"] * 3


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls)
@pytest.mark.parametrize("where", [*ALL_DOORS, "/drf-raising/"])
def test_agree_signals(alice_client: Client, where: str) -> None:
    from idempotency_django import signals

    sent: list[str] = []
    names = ["reserved", "replayed", "conflict", "stored", "released", "unavailable"]
    handlers = {}
    for name in names:

        def handler(sender: Any, _name: str = name, **kwargs: Any) -> None:
            sent.append(_name)

        handlers[name] = handler
        getattr(signals, name).connect(handler)
    try:
        send(alice_client, where, "ok")
        send(alice_client, where, "ok")
        send(alice_client, where, "other")
        send(alice_client, where, "422", key="k-2")
    finally:
        for name in names:
            getattr(signals, name).disconnect(handlers[name])
    assert sent == ["reserved", "stored", "replayed", "conflict", "reserved", "released"]


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls)
@pytest.mark.parametrize("where", ["/m/", "/d/", "/cbv/", "/m-async/", "/d-async/"])
@pytest.mark.parametrize("method", ["get", "head", "options"])
def test_agree_safe_methods_pass_untouched(alice_client: Client, where: str, method: str) -> None:
    answer = getattr(alice_client, method)(where, headers={"Idempotency-Key": "safe"})
    assert answer.get("Idempotency-Key-Ignored") is None
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls)
@pytest.mark.parametrize("where", [*ALL_DOORS, "/drf-raising/"])
def test_agree_store_down_at_claim_runs_nothing(alice_client: Client, where: str) -> None:
    """A Redis store nobody listens for: 503 with Retry-After, and nothing runs."""
    with redis_store_settings(alias=DOWN_ALIAS):
        answer = send(alice_client, where, "ok")
    assert answer.status_code == 503 and answer.json()["code"] == "idempotency_unavailable"
    assert answer.get("Retry-After") == "1"
    assert runs("ok") == 0


# -- GraphQL agrees too --------------------------------------------------------------


ACT = "mutation($key: String, $do: String!) { act(idempotencyKey: $key, do: $do) { id customer } }"


def call(client: Client, do: str, key: str = "g-1") -> dict[str, Any]:
    answer = client.post(
        "/graphql/",
        json.dumps({"query": ACT, "variables": {"key": key, "do": do}}),
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    return answer.json()  # type: ignore[no-any-return]


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls)
def test_agree_graphql_principal_changed(alice: User, bob: User) -> None:
    """A mutation that logs bob in: its answer is not replayed to alice's retry."""
    first_client, retry_client = Client(), Client()
    first_client.force_login(alice)
    retry_client.force_login(alice)
    first = call(first_client, "login_bob")
    retry = call(retry_client, "login_bob")
    assert first["data"]["act"]["customer"] == "bob"
    assert retry["data"]["act"]["customer"] == "bob" and Booking.objects.count() == 2


def veto(request: HttpRequest, response: Any) -> Any:
    return JsonResponse({"detail": "You no longer have access."}, status=403)


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls, IDEMPOTENCY={"REPLAY_HOOK": f"{__name__}.veto"})
def test_a_replay_hooks_veto_is_not_answered_as_a_result(alice_client: Client) -> None:
    """REPLAY_HOOK: "return another response instead, which vetoes the replay (for
    instance a 403 to a user who lost access since)". The REST doors send that 403."""
    first = call(alice_client, "ok")
    retry = call(alice_client, "ok")
    assert "errors" not in first
    assert retry.get("data") is None or retry["data"].get("act") is None, retry


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls, IDEMPOTENCY={"MAX_FINGERPRINTED_BODY": 16})
@pytest.mark.parametrize("where", ALL_DOORS)
def test_agree_a_body_over_the_limit_is_refused_413_and_runs_nothing(
    alice_client: Client, where: str
) -> None:
    answer = alice_client.post(
        where,
        json.dumps({"do": "ok", "padding": "x" * 64}),
        content_type="application/json",
        headers={"Idempotency-Key": "big-1"},
    )
    assert (answer.status_code, answer.json()["code"]) == (413, "idempotency_body_too_large")
    assert runs("ok") == 0


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=urls, IDEMPOTENCY={"MAX_FINGERPRINTED_BODY": 16})
@pytest.mark.parametrize("where", ["/drf/", "/api-view/"])
def test_a_method_drf_answers_405_is_left_alone_whatever_its_body(
    alice_client: Client, where: str
) -> None:
    """No handler for PATCH (the mixin view), or not among ``@api_view``'s methods: DRF
    answers 405, and the middleware neither reads the body nor refuses it: the key is
    one nobody used."""
    answer = alice_client.patch(
        where,
        json.dumps({"do": "ok", "padding": "x" * 64}),
        content_type="application/json",
        headers={"Idempotency-Key": "big-1"},
    )
    assert answer.status_code == 405
    assert answer.get("Idempotency-Key-Ignored") == "unprotected"
