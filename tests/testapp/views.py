"""Views the tests drive: each successful call creates exactly one Booking."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import (
    action,
    api_view,
    authentication_classes,
    permission_classes,
)
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer
from rest_framework.views import APIView

from idempotency_django import idempotency_exempt, idempotent
from idempotency_django.drf import IdempotentMixin
from idempotency_django.protocol.fingerprint import ignore_json_fields, json_fields
from idempotency_django.protocol.options import ViewOptions
from idempotency_django.webhooks import deduplicate_webhook
from tests.testapp.models import Booking


def _apply_test_controls(request: HttpRequest) -> HttpResponse | None:
    from tests import checkpoints

    delay = float(request.GET.get("delay", 0))
    if delay:
        time.sleep(delay)
    # X-Pause-At: NAME: wait there while a test holds that checkpoint (tests/checkpoints.py);
    # a header, so a duplicate without it is still the same request.
    checkpoints.reach(request.headers.get("X-Pause-At", ""))
    # X-Gate: PATH: the same across processes (a test's server): wait until that file
    # exists, at most 30 s.
    gate = request.headers.get("X-Gate", "")
    deadline = time.monotonic() + 30
    while gate and not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    if request.GET.get("raise"):
        raise RuntimeError("the view failed")
    return None


def _owner(request: HttpRequest | Request) -> User | None:
    """The signed-in user; None for a guest."""
    user = request.user
    return user if isinstance(user, User) else None


def create_booking(request: HttpRequest) -> HttpResponseBase:
    """A plain Django view, protected by the middleware."""
    payload = json.loads(request.body or b"{}")
    booking = Booking.objects.create(
        slot=payload.get("slot", ""),
        customer=payload.get("customer", ""),
        location=request.headers.get("X-Location-Id", ""),
        owner=request.user if request.user.is_authenticated else None,
    )
    _apply_test_controls(request)
    wanted = int(request.GET.get("status", 201))
    if request.GET.get("stream"):
        return StreamingHttpResponse(iter([b"streamed ", str(booking.pk).encode()]))
    response = JsonResponse({"id": booking.pk, "slot": booking.slot}, status=wanted)
    response["Location"] = f"/plain/bookings/{booking.pk}/"
    response["X-Debug-Only"] = "not replayed"
    response.set_cookie("session_hint", "secret-cookie-value")
    return response


@idempotent(window=2)
def windowed_booking(request: HttpRequest) -> HttpResponse:
    """A form a browser may submit twice, or an agent's tool may retry, with no key:
    the same request of the same user within 2 s is answered as the first was."""
    booking = Booking.objects.create(
        slot=request.POST.get("slot", ""),
        owner=request.user if request.user.is_authenticated else None,
    )
    _apply_test_controls(request)
    return JsonResponse({"id": booking.pk}, status=201)


@idempotency_exempt
def exempt_booking(request: HttpRequest) -> HttpResponse:
    booking = Booking.objects.create(slot="exempt")
    return JsonResponse({"id": booking.pk}, status=201)


@idempotent(required=True, retention=60)
def required_booking(request: HttpRequest) -> HttpResponse:
    booking = Booking.objects.create(slot="required")
    return JsonResponse({"id": booking.pk}, status=201)


@idempotent(retain_client_errors=True)
def client_error_booking(request: HttpRequest) -> HttpResponse:
    Booking.objects.create(slot="client-error")
    return JsonResponse({"error": "nope"}, status=int(request.GET.get("status", 422)))


@idempotent(atomic=True)
def atomic_booking(request: HttpRequest) -> HttpResponse:
    payload = json.loads(request.body or b"{}")
    booking = Booking.objects.create(slot=payload.get("slot", "atomic"))
    _apply_test_controls(request)
    return JsonResponse({"id": booking.pk}, status=201)


@idempotent(atomic=True)
def atomic_returns_no_response(request: HttpRequest) -> HttpResponse:
    """Books, then returns what a ninja operation would: a tuple, not a response."""
    booking = Booking.objects.create(slot="tuple-atomic")
    return (201, {"id": booking.pk})  # type: ignore[return-value]


@idempotent
def returns_no_response(request: HttpRequest) -> HttpResponse:
    booking = Booking.objects.create(slot="tuple")
    return (201, {"id": booking.pk})  # type: ignore[return-value]


def token_booking(request: HttpRequest) -> HttpResponse:
    """Authenticates a token of its own inside the view, whoever the session says."""
    from rest_framework.authtoken.models import Token

    token = request.headers.get("X-Token")
    if token:
        request.user = Token.objects.select_related("user").get(key=token).user
    booking = Booking.objects.create(slot="token", owner=_owner(request))
    return JsonResponse({"id": booking.pk, "owner": request.user.username}, status=201)


@idempotent
class BookingCBV(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        booking = Booking.objects.create(slot="cbv")
        return JsonResponse({"id": booking.pk}, status=201)


def _click() -> JsonResponse:
    Booking.objects.create(slot="click")
    return JsonResponse({"clicks": Booking.objects.filter(slot="click").count()})


@idempotent
class ClickCounterCBV(View):
    """Bookings are protected; its clicks count every time they are sent."""

    def post(self, request: HttpRequest) -> HttpResponse:
        booking = Booking.objects.create(slot="cbv")
        return JsonResponse({"id": booking.pk}, status=201)

    @idempotency_exempt
    def put(self, request: HttpRequest) -> HttpResponse:
        return _click()


@idempotent
class AsyncClickCounterCBV(View):
    @idempotency_exempt
    async def post(self, request: HttpRequest) -> HttpResponse:
        return await sync_to_async(_click)()


class PlainClickCBV(View):
    """No decoration: the middleware would protect it, but for the handler's mark."""

    @idempotency_exempt
    def post(self, request: HttpRequest) -> HttpResponse:
        return _click()


class SlotCBV(View):
    """``@idempotent`` on the handler, with options of its own: only the slot counts."""

    @idempotent(fingerprint=json_fields("slot"))
    def post(self, request: HttpRequest) -> HttpResponse:
        booking = Booking.objects.create(slot=json.loads(request.body)["slot"])
        return JsonResponse({"id": booking.pk}, status=201)


@idempotent(required=True)
class SlotUnderClassCBV(SlotCBV):
    """``@idempotent`` on the class too: the handler's own options still decide."""


class ChargeThenAudit(APIView):
    """``@idempotent`` on a method the handler calls; its refusals are raised."""

    raise_idempotency_errors = True

    def post(self, request: Request) -> Response:
        answer = self.charge(request)
        Booking.objects.create(slot="audit")  # only once charge() has answered
        return answer

    @idempotent
    def charge(self, request: Request) -> Response:
        Booking.objects.create(slot="charge")
        return Response({"charged": json.loads(request.body)["amount"]}, status=201)


class BookingSerializer(serializers.ModelSerializer[Booking]):
    class Meta:
        model = Booking
        fields = ["id", "slot", "customer", "location"]


class _BookingViewSetBase(viewsets.ModelViewSet[Booking]):
    serializer_class = BookingSerializer

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return Booking.objects.filter(owner=_owner(self.request))

    def perform_create(self, serializer: BaseSerializer[Booking]) -> None:
        serializer.save(
            owner=self.request.user, location=self.request.headers.get("X-Location-Id", "")
        )
        _apply_test_controls(self.request)

    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):  # type: ignore[no-untyped-def]
        booking = self.get_object()
        Booking.objects.create(slot=f"cancel-{booking.pk}", owner=request.user)
        return Response({"cancelled": booking.pk})

    def book(self, request):  # type: ignore[no-untyped-def]
        """Routed by ``as_view({"post": "book"})`` in urls.py: no ``@action``, no usual name."""
        Booking.objects.create(slot="routed", owner=request.user)
        return Response({"booked": True}, status=status.HTTP_201_CREATED)

    @idempotency_exempt
    @action(detail=False, methods=["post"])
    def ping(self, request):  # type: ignore[no-untyped-def]
        Booking.objects.create(slot="ping", owner=request.user)
        return Response({"pong": True})

    @idempotent(required=True)
    @action(detail=False, methods=["post"])
    def strict(self, request):  # type: ignore[no-untyped-def]
        Booking.objects.create(slot="strict", owner=request.user)
        return Response({"strict": True}, status=status.HTTP_201_CREATED)


@idempotent
class BookingViewSet(_BookingViewSetBase):
    pass


class MixinBookingViewSet(IdempotentMixin, _BookingViewSetBase):
    idempotency_options = ViewOptions(required=True)


class UnprotectedBookingViewSet(_BookingViewSetBase):
    pass


class WindowedBookingViewSet(IdempotentMixin, _BookingViewSetBase):
    """For API clients that mint no key: the same request within 2 s is answered once."""

    idempotency_options = ViewOptions(window=2)


class StrictBookingViewSet(BookingViewSet):
    """A subclass of a decorated viewset with options of its own."""

    idempotency_options = ViewOptions(required=True)


@idempotent(retention=60)
class DecoratedMixinBookingViewSet(MixinBookingViewSet):
    """``@idempotent`` on a subclass of an ``IdempotentMixin`` viewset: its options win."""


@api_view(["POST"])
@idempotent(retention=60)
def api_book(request):  # type: ignore[no-untyped-def]
    serializer = BookingSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    serializer.save(owner=request.user)
    return Response(serializer.data, status=status.HTTP_201_CREATED)


def crash_before_commit(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Outside @idempotent but inside the ATOMIC_REQUESTS transaction: fails after the
    response was stored, as a crash between "work done" and "commit" would."""

    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        if request.GET.get("crash"):
            raise RuntimeError("crashed before commit")
        return response

    return wrapper


@crash_before_commit
@idempotent
def fragile_booking(request: HttpRequest) -> HttpResponse:
    booking = Booking.objects.create(slot="fragile")
    return JsonResponse({"id": booking.pk}, status=201)


@deduplicate_webhook(id_header="webhook-id")
def webhook_receiver(request: HttpRequest, token: str) -> HttpResponse:
    """Each accepted delivery starts one run (a Booking row)."""
    return _webhook_run(request, token)


@deduplicate_webhook
def fallback_webhook_receiver(request: HttpRequest, token: str) -> HttpResponse:
    """Names no id: WEBHOOK_ID_HEADER, WEBHOOK_BODY_ID_FUNCTION or the fallback."""
    return _webhook_run(request, token)


def _webhook_run(request: HttpRequest, token: str) -> HttpResponse:
    _apply_test_controls(request)
    if request.GET.get("fail"):
        return JsonResponse({"status": "failed"}, status=int(request.GET["fail"]))
    run = Booking.objects.create(slot="webhook-run", customer=token[:0])
    if request.GET.get("refuse"):
        # Refused after writing (an event it cannot handle yet): the sender retries it.
        return JsonResponse({"status": "refused"}, status=int(request.GET["refuse"]))
    return JsonResponse({"status": "accepted", "run_id": run.pk}, status=202)


class Tenant:
    """What a project's path converter may hand a view: an object of its own."""

    def __init__(self, slug: str) -> None:
        self.slug = slug


class TenantConverter:
    regex = "[a-z]+"

    def to_python(self, value: str) -> Tenant:
        return Tenant(value)

    def to_url(self, value: Tenant) -> str:
        return value.slug


@deduplicate_webhook(id_header="webhook-id")
def tenant_webhook_receiver(request: HttpRequest, tenant: Tenant, token: str) -> HttpResponse:
    """A receiver whose URL converts the tenant to a ``Tenant``."""
    return _webhook_run(request, token)


def reads_the_signed_form(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A verifier of form deliveries (Mailgun's): reads its signed fields from ``request.POST``.

    Above ``@deduplicate_webhook``, as the docs say: on a multipart delivery it leaves
    no raw body behind it.
    """

    @functools.wraps(view)
    def verified(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        request.POST.get("signature")
        return view(request, *args, **kwargs)

    return verified


@csrf_exempt
@reads_the_signed_form
@deduplicate_webhook
def form_webhook_receiver(request: HttpRequest, token: str) -> HttpResponse:
    """The fallback identity after a verifier that parsed the form."""
    return _webhook_run(request, token)


@csrf_exempt
@reads_the_signed_form
@deduplicate_webhook(body_id=lambda request: request.POST.get("token"))
def form_token_webhook_receiver(request: HttpRequest, token: str) -> HttpResponse:
    """The same, identified by the form's signed ``token`` field."""
    return _webhook_run(request, token)


@api_view(["POST"])
@permission_classes([AllowAny])
@authentication_classes([])
@deduplicate_webhook(retention=3600, id_header="svix-id")
def drf_webhook_receiver(request, token):  # type: ignore[no-untyped-def]
    run = Booking.objects.create(slot="drf-webhook-run")
    if request.GET.get("refuse"):
        return Response({"status": "refused"}, status=int(request.GET["refuse"]))
    return Response({"status": "accepted", "run_id": run.pk}, status=202)


@deduplicate_webhook(id_header="webhook-id")
async def async_webhook_receiver(request: HttpRequest, token: str) -> HttpResponse:
    run = await Booking.objects.acreate(slot="async-webhook-run")
    return JsonResponse({"status": "accepted", "run_id": run.pk}, status=202)


async def async_booking(request: HttpRequest) -> HttpResponse:
    """An async view, protected by the middleware (under ASGI and WSGI alike)."""
    payload = json.loads(request.body or b"{}")
    user = await sync_to_async(lambda: request.user)()  # request.auser() is Django 5.0+
    booking = await Booking.objects.acreate(
        slot=payload.get("slot", ""), owner=user if user.is_authenticated else None
    )
    from tests import checkpoints

    delay = float(request.GET.get("delay", 0))
    if delay:
        await asyncio.sleep(delay)
    await checkpoints.reach_async(request.headers.get("X-Pause-At", ""))  # as in a sync view
    return JsonResponse({"id": booking.pk, "slot": booking.slot}, status=201)


@idempotent(required=True)
class AsyncBookingCBV(View):
    async def post(self, request: HttpRequest) -> HttpResponse:
        booking = await Booking.objects.acreate(slot="decorated-async")
        if request.GET.get("status"):
            return JsonResponse({"error": True}, status=int(request.GET["status"]))
        return JsonResponse({"id": booking.pk}, status=201)


@idempotent(required=True)
async def decorated_async_booking(request: HttpRequest) -> HttpResponse:
    booking = await Booking.objects.acreate(slot="decorated-async")
    if request.GET.get("status"):
        return JsonResponse({"error": True}, status=int(request.GET["status"]))
    return JsonResponse({"id": booking.pk}, status=201)


def paused_booking(request: HttpRequest) -> HttpResponse:
    """Books, then waits at the checkpoint named by ``?at=`` while a test acts.

    The checkpoint learns this request's database connection: its server-side
    id, so a test can cut it, and on SQLite a short busy timeout, so a lock a
    test holds makes the store fail fast.
    """
    from django.db import connection

    from tests import checkpoints

    booking = Booking.objects.create(
        slot="paused", owner=request.user if request.user.is_authenticated else None
    )
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
            server_id = cursor.fetchone()[0]
        elif connection.vendor == "mysql":
            cursor.execute("SELECT CONNECTION_ID()")
            server_id = cursor.fetchone()[0]
        else:
            cursor.execute("PRAGMA busy_timeout = 300")
            server_id = None
    checkpoints.reach(request.GET.get("at", ""), server_id=server_id)
    return JsonResponse({"id": booking.pk}, status=int(request.GET.get("status", 201)))


def form_booking(request: HttpRequest) -> HttpResponse:
    """A plain form view (urlencoded or multipart), protected by the middleware.

    Answers with what it received, so a test can see the body reached it whole.
    """
    import hashlib

    upload = request.FILES.get("attachment")
    received = {
        "slot": request.POST.get("slot", ""),
        "attachment_sha256": hashlib.sha256(upload.read()).hexdigest() if upload else None,
        "attachment_size": upload.size if upload else None,
    }
    booking = Booking.objects.create(slot=str(received["slot"]), owner=_owner(request))
    return JsonResponse({"id": booking.pk, **received}, status=201)


@api_view(["POST"])
@idempotent
def api_form_booking(request):  # type: ignore[no-untyped-def]
    """``@idempotent`` below ``@api_view``: DRF's parsers read the same body."""
    import hashlib

    upload = request.data.get("attachment")
    booking = Booking.objects.create(slot=str(request.data.get("slot", "")), owner=request.user)
    return Response(
        {
            "id": booking.pk,
            "slot": booking.slot,
            "attachment_sha256": hashlib.sha256(upload.read()).hexdigest() if upload else None,
        },
        status=status.HTTP_201_CREATED,
    )


def large_booking(request: HttpRequest) -> HttpResponse:
    """Answers ``?size=`` bytes of JSON: over MAX_STORED_BODY when large enough."""
    booking = Booking.objects.create(slot="large", owner=_owner(request))
    size = int(request.GET.get("size", 0))
    return JsonResponse({"id": booking.pk, "padding": "x" * size}, status=201)


@idempotent(max_stored_body=64)
def small_limit_booking(request: HttpRequest) -> HttpResponse:
    booking = Booking.objects.create(slot="small-limit", owner=_owner(request))
    return JsonResponse({"id": booking.pk, "padding": "x" * 100}, status=201)


def long_principal_scope(request: HttpRequest):  # type: ignore[no-untyped-def]
    """A custom SCOPE_FUNCTION whose principals are longer than the column."""
    from idempotency_django.protocol.scope import Scope, location_of

    if not request.user.is_authenticated:
        return None
    return Scope(principal=f"tenant-{'t' * 260}:{request.user.pk}", location=location_of(request))


@idempotent(fingerprint=json_fields("slot", "customer"))
def slot_booking(request: HttpRequest) -> HttpResponse:
    """A retry that differs only in fields other than slot and customer replays."""
    payload = json.loads(request.body)
    booking = Booking.objects.create(slot=payload["slot"], owner=_owner(request))
    return JsonResponse({"id": booking.pk}, status=201)


@idempotent(fingerprint=ignore_json_fields("sent_at", "nonce"))
def nonce_booking(request: HttpRequest) -> HttpResponse:
    payload = json.loads(request.body)
    booking = Booking.objects.create(slot=payload.get("slot", ""), owner=_owner(request))
    return JsonResponse({"id": booking.pk}, status=201)


def organisation_scope(request: HttpRequest):  # type: ignore[no-untyped-def]
    """Keys shared by everyone of an organisation (its X-Organisation header, in this test)."""
    from idempotency_django.protocol.scope import Scope

    organisation = request.headers.get("X-Organisation")
    return Scope(principal=f"org:{organisation}") if organisation else None


@idempotent(scope="tests.testapp.views.organisation_scope")
def organisation_booking(request: HttpRequest) -> HttpResponse:
    booking = Booking.objects.create(slot="org")
    return JsonResponse({"id": booking.pk}, status=201)


class OrganisationUploadCBV(View):
    """A form (multipart) of an organisation's, no login: the handler's own scope."""

    @idempotent(scope="tests.testapp.views.organisation_scope")
    def post(self, request: HttpRequest) -> HttpResponse:
        booking = Booking.objects.create(slot=request.POST["slot"])
        return JsonResponse({"id": booking.pk}, status=201)


@csrf_exempt
def guest_booking(request: HttpRequest) -> HttpResponse:
    """A public form: no login, protected through the guest's session."""
    booking = Booking.objects.create(slot=request.POST.get("slot", "guest"))
    return JsonResponse({"id": booking.pk}, status=201)


@api_view(["POST"])
@permission_classes([AllowAny])
@idempotent
def api_public_booking(request):  # type: ignore[no-untyped-def]
    """Open to anonymous callers: their keys are not used (ANONYMOUS="ignore")."""
    booking = Booking.objects.create(slot="public")
    return Response({"id": booking.pk}, status=status.HTTP_201_CREATED)


@api_view(["POST"])
@idempotent(fingerprint=json_fields("slot"))
def api_slot_booking(request):  # type: ignore[no-untyped-def]
    booking = Booking.objects.create(slot=str(request.data.get("slot", "")), owner=request.user)
    return Response({"id": booking.pk}, status=status.HTTP_201_CREATED)


@idempotent
async def async_failing_booking(request: HttpRequest) -> HttpResponse:
    """An async view under @idempotent that raises with ?raise=1."""
    booking = await Booking.objects.acreate(slot="async-failing")
    if request.GET.get("raise"):
        raise RuntimeError("the async view failed")
    return JsonResponse({"id": booking.pk}, status=201)
