"""Who a key belongs to (users behind Django's lazy ``request.user``, users read from
a replica), what a refusal writes in the log, and which keyed answers say the key was
not used. Each test failed before its fix (a review, 2026-12-06)."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import include, path
from django.utils.functional import SimpleLazyObject
from django.views.decorators.csrf import csrf_exempt
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from idempotency_django.decorators import idempotency_exempt
from idempotency_django.drf import IdempotentMixin
from idempotency_django.protocol import phases
from idempotency_django.protocol.scope import default_scope

# -- non-model users behind Django's lazy request.user ---------------------------


class ServiceAccount:
    """A user object that is not a model: an internal service account."""

    is_authenticated = True
    is_active = True

    def __init__(self, pk: str) -> None:
        self.pk = pk


class PartnerClient:
    """Another kind of non-model user, from another backend, same id space."""

    is_authenticated = True
    is_active = True

    def __init__(self, pk: str) -> None:
        self.pk = pk


class ServiceBackend:
    def get_user(self, user_id: Any) -> ServiceAccount:
        return ServiceAccount(user_id)


class PartnerBackend:
    def get_user(self, user_id: Any) -> PartnerClient:
        return PartnerClient(user_id)


_counter = itertools.count(1)


def who_pays(request: HttpRequest) -> HttpResponse:
    """Answers with data only the authenticated principal may see."""
    kind = request.user.__class__.__name__
    return JsonResponse({"run": next(_counter), "statement_of": kind}, status=201)


urlpatterns: list[Any] = [path("edges/pay/", who_pays)]

BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    f"{__name__}.ServiceBackend",
    f"{__name__}.PartnerBackend",
]


def client_logged_in_with(backend: str, user_id: int) -> Client:
    session = SessionStore()
    session["_auth_user_id"] = str(user_id)
    session["_auth_user_backend"] = backend
    session.save()
    client = Client()
    client.cookies["sessionid"] = str(session.session_key)
    return client


def test_two_kinds_of_non_model_user_are_two_principals_behind_a_lazy_user() -> None:
    """scope.principal_of names a non-model user by type(user): Django's request.user is a
    SimpleLazyObject, so every non-model user is named after SimpleLazyObject."""
    request_a, request_b = HttpRequest(), HttpRequest()
    request_a.user = SimpleLazyObject(lambda: ServiceAccount("7"))  # type: ignore[assignment]
    request_b.user = SimpleLazyObject(lambda: PartnerClient("7"))  # type: ignore[assignment]
    scope_a, scope_b = default_scope(request_a), default_scope(request_b)
    assert scope_a is not None and scope_b is not None
    assert scope_a.principal != scope_b.principal, scope_a.principal


@pytest.mark.django_db
@pytest.mark.urls(__name__)
@override_settings(AUTHENTICATION_BACKENDS=BACKENDS)
def test_a_partner_never_gets_a_service_accounts_stored_answer() -> None:
    service = client_logged_in_with(f"{__name__}.ServiceBackend", 7)
    partner = client_logged_in_with(f"{__name__}.PartnerBackend", 7)
    body = json.dumps({"amount": 10})
    first = service.post(
        "/edges/pay/", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert first.status_code == 201 and first.json()["statement_of"] == "ServiceAccount"
    other = partner.post(
        "/edges/pay/", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert other.json()["statement_of"] == "PartnerClient", other.json()
    assert "Idempotency-Replayed" not in other


# -- a protected DRF view's throttled request is told its key was "unprotected" ----


class AlwaysThrottled(BaseThrottle):
    def allow_request(self, request: Any, view: Any) -> bool:
        return False

    def wait(self) -> float:
        return 3


class ThrottledBookings(IdempotentMixin, APIView):
    permission_classes = [AllowAny]
    throttle_classes = [AlwaysThrottled]

    def post(self, request: Any) -> Response:
        return Response({"booked": True}, status=201)


urlpatterns.append(path("edges/throttled/", ThrottledBookings.as_view()))


@pytest.mark.django_db
@pytest.mark.urls(__name__)
def test_a_protected_drf_views_429_is_not_marked_unprotected(
    alice_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    phases._LOGGED_UNPROTECTED.clear()
    with caplog.at_level(logging.WARNING, logger="idempotency_django"):
        answer = alice_client.post(
            "/edges/throttled/",
            "{}",
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY="t-1",
        )
    assert answer.status_code == 429
    warnings = [r.getMessage() for r in caplog.records if "unprotected" in r.getMessage()]
    # The route IS protected by IdempotentMixin. The project's retry client gives up on
    # any answer with this header (but a 401): a 429 that ran nothing is never retried.
    marker = answer.get("Idempotency-Key-Ignored")
    assert (warnings, marker) == ([], None), (warnings, marker)


# -- keyed refusals that write no INFO line ----------------------------------------


def _info_events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.idempotency["event"]
        for r in caplog.records
        if r.levelno == logging.INFO and hasattr(r, "idempotency")
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "case",
    [
        "location_invalid",
        "authentication_required",
        "body_too_large",
        "body_too_large-drf-without-middleware",
        "key_invalid",
    ],
)
def test_every_keyed_refusal_writes_its_one_info_line(
    case: str,
    alice_client: Client,
    caplog: pytest.LogCaptureFixture,
    settings: Any,
) -> None:
    client = alice_client
    extra: dict[str, Any] = {}
    settings_: dict[str, Any] = {}
    body = "{}"
    key = "r-1"
    url = "/plain/bookings/"
    if case.endswith("-drf-without-middleware"):
        # The DRF view readies its body itself, and answers the 413 at its claim.
        settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "idempotency" not in m]
        case, url = "body_too_large", "/api/bookings/"
    if case == "location_invalid":
        extra = {"HTTP_X_LOCATION_ID": "a\x01b"}
    elif case == "authentication_required":
        client, settings_ = Client(), {"ANONYMOUS": "reject"}
    elif case == "body_too_large":
        settings_ = {"MAX_FINGERPRINTED_BODY": 10}
        body = json.dumps({"slot": "x" * 100})
    else:
        key = "a,b"
    with (
        override_settings(IDEMPOTENCY=settings_),
        caplog.at_level(logging.INFO, logger="idempotency_django"),
    ):
        answer = client.post(
            url,
            body,
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key,
            **extra,
        )
    assert answer.status_code in (400, 401, 413), answer.content
    assert answer["Content-Type"] == "application/problem+json"
    # docs/operating.md: "Every keyed request the library protects writes one line ...
    # at INFO, once, at its end: its outcome (..., refused as conflict or rejected with
    # its code, ...)".
    assert _info_events(caplog) == ["rejected"], (answer.json()["code"], _info_events(caplog))


# -- read replicas: one user, two principals --------------------------------------


_REPLICAS = itertools.cycle(["replica1", "replica2"])


class PrimaryReplicaRouter:
    """Django's documented router ("Multiple databases"), random.choice made repeatable:
    reads go to a replica, writes to the primary."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return next(_REPLICAS) if model._meta.label == "auth.User" else "default"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == "default"


@contextlib.contextmanager
def replicas() -> Iterator[None]:
    """Two replicas of the test database (the same SQLite file: replication lag zero),
    made as connections only, so that the test case's fence lets them through."""
    primary = connections["default"]
    made = {}
    for alias in ("replica1", "replica2"):
        made[alias] = type(primary)({**primary.settings_dict}, alias)
        setattr(connections._connections, alias, made[alias])  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for alias, wrapper in made.items():
            wrapper.close()
            delattr(connections._connections, alias)  # type: ignore[attr-defined]


RUNS: list[Any] = []


@csrf_exempt
def charge(request: HttpRequest) -> HttpResponse:
    RUNS.append(request.user.pk)
    return JsonResponse({"charged": len(RUNS)}, status=201)


urlpatterns.append(path("edges/charge/", charge))


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls(__name__)
@override_settings(DATABASE_ROUTERS=[f"{__name__}.PrimaryReplicaRouter"])
def test_a_retry_whose_user_was_read_from_another_replica_runs_once() -> None:
    RUNS.clear()
    dana = User.objects.db_manager("default").create_user("dana-replica")
    client = Client()
    with replicas():  # added after the test's setup: pytest-django would fence them off
        client.force_login(dana)
        answers = [
            client.post("/edges/charge/", "{}", "application/json", HTTP_IDEMPOTENCY_KEY="c-1")
            for _ in range(2)
        ]
    assert [a.status_code for a in answers] == [201, 201]
    from idempotency_django.models import IdempotencyRecord

    principals = sorted(IdempotencyRecord.objects.values_list("principal", flat=True))
    assert len(RUNS) == 1, f"charged {len(RUNS)} times, stored under {principals}"


# -- a DRF handler under @idempotency_exempt: its body is its own ----------------------
# (A DRF view with no mark at all is readied as a protected one: @idempotent may be on a
# method its handler calls, `create`, which no look at the view can see.)


class ExemptUploads(IdempotentMixin, APIView):
    permission_classes = [AllowAny]

    @idempotency_exempt
    def post(self, request: Any) -> Response:
        return Response({"size": len(request.body)}, status=201)


@api_view(["POST"])
@permission_classes([AllowAny])
@idempotency_exempt
def exempt_upload(request: Any) -> Response:
    return Response({"size": len(request.body)}, status=201)


urlpatterns.append(path("edges/exempt-upload/", ExemptUploads.as_view()))
urlpatterns.append(path("edges/exempt-api-view/", exempt_upload))
urlpatterns.append(path("", include("tests.urls")))


@pytest.mark.django_db
@pytest.mark.urls(__name__)
@pytest.mark.parametrize("url", ["/edges/exempt-upload/", "/edges/exempt-api-view/"])
def test_a_view_the_library_does_not_protect_is_not_refused_for_its_body(
    alice_client: Client, url: str
) -> None:
    body = json.dumps({"slot": "2026-08-05T09:00:00Z", "customer": "alice"}) + " " * 2000
    with override_settings(IDEMPOTENCY={"MAX_FINGERPRINTED_BODY": 1000}):
        answer = alice_client.post(url, body, "application/json", HTTP_IDEMPOTENCY_KEY="big-1")
    # Without the key the view answers 201; with it, the library that ignores the key
    # (it would say "Idempotency-Key-Ignored: unprotected") refuses the request first.
    assert answer.status_code == 201, (answer.status_code, answer.content[:200])
    assert answer["Idempotency-Key-Ignored"] == "unprotected"
