"""Each view books once per run (a ``Booking`` row), then takes ``?delay=`` seconds: a
client that hangs up meanwhile leaves work that commits without it."""

from __future__ import annotations

import asyncio
import time

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from idempotency_django import idempotent
from idempotency_django.webhooks import deduplicate_webhook
from tests.testapp.models import Booking


def _delay(request: HttpRequest) -> float:
    return float(request.GET.get("delay", 0))


def _owner(request: HttpRequest):  # type: ignore[no-untyped-def]
    return request.user if request.user.is_authenticated else None


def sync_booking(request: HttpRequest) -> HttpResponse:
    """A plain sync view (the middleware protects it); atomic under ``ATOMIC_REQUESTS``."""
    booking = Booking.objects.create(slot="sync", owner=_owner(request))
    time.sleep(_delay(request))
    return JsonResponse({"id": booking.pk}, status=201)


def template_booking(request: HttpRequest) -> HttpResponse:
    """Books, then answers with a template that fails to render when asked to."""
    booking = Booking.objects.create(slot="template", owner=_owner(request))
    fail = "HTTP_X_FAIL_TEMPLATE" in request.META
    return TemplateResponse(
        request, "hangup/booked.html", {"booking": booking, "fail": fail}, status=201
    )


def hooked_booking(request: HttpRequest) -> HttpResponse:
    """Books and registers a confirmation after the commit that fails (Django's
    default ``on_commit`` is not robust: a hook that raises stops the ones after it)."""
    booking = Booking.objects.create(slot="hooked", owner=_owner(request))

    def send_confirmation() -> None:
        raise ConnectionError("the mail server is down")

    transaction.on_commit(send_confirmation)
    return JsonResponse({"id": booking.pk}, status=201)


def unpaid_booking(request: HttpRequest) -> HttpResponse:
    """Books; with ``X-Break-Commit`` the booking names an owner that does not exist,
    which the database finds only at COMMIT (Django's foreign keys are deferred)."""
    owner_id = 10**9 if "HTTP_X_BREAK_COMMIT" in request.META else None
    booking = Booking.objects.create(slot="unpaid", owner_id=owner_id)
    return JsonResponse({"id": booking.pk}, status=201)


@transaction.non_atomic_requests
async def async_booking(request: HttpRequest) -> HttpResponse:
    """An async view (the middleware protects it)."""
    user = await request.auser()
    booking = await Booking.objects.acreate(
        slot="async", owner=user if user.is_authenticated else None
    )
    await asyncio.sleep(_delay(request))
    return JsonResponse({"id": booking.pk}, status=201)


@transaction.non_atomic_requests
@idempotent
async def decorated_async_booking(request: HttpRequest) -> HttpResponse:
    user = await request.auser()
    booking = await Booking.objects.acreate(
        slot="decorated-async", owner=user if user.is_authenticated else None
    )
    await asyncio.sleep(_delay(request))
    return JsonResponse({"id": booking.pk}, status=201)


@idempotent
def decorated_sync_booking(request: HttpRequest) -> HttpResponse:
    booking = Booking.objects.create(slot="decorated-sync", owner=_owner(request))
    time.sleep(_delay(request))
    return JsonResponse({"id": booking.pk}, status=201)


@transaction.non_atomic_requests
@deduplicate_webhook(id_header="Webhook-Id")
async def async_webhook(request: HttpRequest, token: str) -> HttpResponse:
    """A payment provider's delivery: one payment per delivery."""
    payment = await Booking.objects.acreate(slot="payment")
    await asyncio.sleep(_delay(request))
    return JsonResponse({"status": "accepted", "payment": payment.pk}, status=202)


class BookingSerializer(serializers.Serializer[Booking]):
    slot = serializers.CharField()

    def validate_slot(self, value: str) -> str:
        if value == "taken":
            raise serializers.ValidationError("This slot is taken.")
        return value


@api_view(["POST"])
@idempotent
def drf_booking(request: Request) -> Response:
    """A DRF view: writes, then may refuse the slot (400) after writing."""
    booking = Booking.objects.create(slot="drf", owner=_owner(request))
    serializer = BookingSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    time.sleep(_delay(request))
    return Response({"id": booking.pk}, status=status.HTTP_201_CREATED)


@api_view(["POST"])
@idempotent(atomic=True)
def drf_atomic_booking(request: Request) -> Response:
    """``atomic=True`` without ``ATOMIC_REQUESTS``: a refusal after the write rolls it back."""
    booking = Booking.objects.create(slot="drf-atomic", owner=_owner(request))
    serializer = BookingSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    return Response({"id": booking.pk}, status=status.HTTP_201_CREATED)


@api_view(["POST"])
@idempotent(retain_client_errors=True)
def drf_retaining_booking(request: Request) -> Response:
    booking = Booking.objects.create(slot="drf-retaining", owner=_owner(request))
    serializer = BookingSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    return Response({"id": booking.pk}, status=status.HTTP_201_CREATED)
