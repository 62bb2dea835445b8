"""Views of the hang-up review: each run books one ``Booking`` row, counting runs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI, Schema

from idempotency_django.ninja import idempotent
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


api = NinjaAPI(urls_namespace="review-hangups")


class BookingIn(Schema):
    slot: str


class BookingOut(Schema):
    id: int
    slot: str


def _delay(request: HttpRequest) -> float:
    return float(request.GET.get("delay", 0))


@api.post("/bookings", response={201: BookingOut}, auth=BearerAuth())
@idempotent
def ninja_booking(request: HttpRequest, payload: BookingIn) -> Any:
    booking = Booking.objects.create(slot="ninja-sync", customer=payload.slot)
    time.sleep(_delay(request))
    return 201, booking


@api.post("/atomic-bookings", response={201: BookingOut}, auth=BearerAuth())
@idempotent(atomic=True)
def ninja_atomic_booking(request: HttpRequest, payload: BookingIn) -> Any:
    booking = Booking.objects.create(slot="ninja-atomic", customer=payload.slot)
    time.sleep(_delay(request))
    return 201, booking


@api.post("/async-bookings", response={201: BookingOut}, auth=AsyncBearerAuth())
@idempotent
async def ninja_async_booking(request: HttpRequest, payload: BookingIn) -> Any:
    booking = await Booking.objects.acreate(slot="ninja-async", customer=payload.slot)
    await asyncio.sleep(_delay(request))
    return 201, booking
