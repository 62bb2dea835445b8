"""Views of the hang-up matrix: each run books one ``Booking`` row, counting runs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Schema
from rest_framework import status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from idempotency_django import idempotent as core_idempotent
from idempotency_django.ninja import idempotent
from idempotency_django.webhooks import deduplicate_webhook
from tests.testapp.models import Booking
from tests.testapp.ninja_api import AsyncBearerAuth, BearerAuth


def form_booking(request: HttpRequest) -> HttpResponse:
    """A plain sync view fed by an HTML form: books the ``slot`` and ``customer`` posted."""
    booking = Booking.objects.create(
        slot=request.POST.get("slot", ""), customer=request.POST.get("customer", "")
    )
    return JsonResponse(
        {"id": booking.pk, "slot": booking.slot, "customer": booking.customer}, status=201
    )


# Senders send no CSRF token: receivers are exempt, as a project's are.
@csrf_exempt
@deduplicate_webhook
def form_webhook(request: HttpRequest, token: str) -> HttpResponse:
    """A sender's form delivery without a delivery id (the fallback identity): one run each."""
    return form_booking(request)


@csrf_exempt
@deduplicate_webhook(id_header="Webhook-Id")
def form_webhook_with_id(request: HttpRequest, token: str) -> HttpResponse:
    """The same, identified by its ``Webhook-Id``."""
    return form_booking(request)


def _delay(request: HttpRequest) -> float:
    return float(request.GET.get("delay", 0))


def _key(request: HttpRequest) -> str:
    return str(request.META.get("HTTP_IDEMPOTENCY_KEY", ""))


# Each of these books a row named after the request's key, then takes ``?delay=``
# seconds: counting the rows of a key counts the runs of that key.


def keyed_sync(request: HttpRequest) -> HttpResponse:
    """A plain sync view (the middleware); atomic under ``ATOMIC_REQUESTS``."""
    booking = Booking.objects.create(slot="sync", customer=_key(request))
    time.sleep(_delay(request))
    return JsonResponse({"id": booking.pk, "slot": booking.slot}, status=201)


@transaction.non_atomic_requests
async def keyed_async(request: HttpRequest) -> HttpResponse:
    """An async view (the middleware)."""
    booking = await Booking.objects.acreate(slot="async", customer=_key(request))
    await asyncio.sleep(_delay(request))
    return JsonResponse({"id": booking.pk, "slot": booking.slot}, status=201)


@api_view(["POST"])
@core_idempotent
def keyed_drf(request: Request) -> Response:
    """A DRF view (``@idempotent`` below ``@api_view``)."""
    booking = Booking.objects.create(slot="drf", customer=_key(request))
    time.sleep(_delay(request))
    return Response({"id": booking.pk, "slot": booking.slot}, status=status.HTTP_201_CREATED)


def keyed_template(request: HttpRequest) -> HttpResponse:
    """A sync view answering with a lazily rendered response (the middleware)."""
    booking = Booking.objects.create(slot="template", customer=_key(request))
    time.sleep(_delay(request))
    return TemplateResponse(request, "hangup/booked.html", {"booking": booking}, status=201)


@transaction.non_atomic_requests
@core_idempotent
async def keyed_async_template(request: HttpRequest) -> HttpResponse:
    """An async ``@idempotent`` view answering with a lazily rendered response, which
    the decorator renders before it stores it."""
    booking = await Booking.objects.acreate(slot="async-template", customer=_key(request))
    await asyncio.sleep(_delay(request))
    return TemplateResponse(request, "hangup/booked.html", {"booking": booking}, status=201)


api = NinjaAPI(urls_namespace="review-hangups")


class BookingIn(Schema):
    slot: str


class BookingOut(Schema):
    id: int
    slot: str


@api.post("/bookings", response={201: BookingOut}, auth=BearerAuth())
@idempotent
def ninja_booking(request: HttpRequest, payload: BookingIn) -> Any:
    booking = Booking.objects.create(slot="ninja-sync", customer=_key(request))
    time.sleep(_delay(request))
    return 201, booking


@api.post("/atomic-bookings", response={201: BookingOut}, auth=BearerAuth())
@idempotent(atomic=True)
def ninja_atomic_booking(request: HttpRequest, payload: BookingIn) -> Any:
    booking = Booking.objects.create(slot="ninja-atomic", customer=_key(request))
    time.sleep(_delay(request))
    return 201, booking


@api.post("/async-bookings", response={201: BookingOut}, auth=AsyncBearerAuth())
@idempotent
async def ninja_async_booking(request: HttpRequest, payload: BookingIn) -> Any:
    booking = await Booking.objects.acreate(slot="ninja-async", customer=_key(request))
    await asyncio.sleep(_delay(request))
    return 201, booking
