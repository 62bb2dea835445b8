"""A django-ninja API protected by ``idempotency_django.ninja``, for tests/test_ninja.py.

Each operation books a row per execution: counting ``Booking`` rows counts runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI, Router, Schema, Status
from ninja.errors import HttpError
from ninja.security import APIKeyHeader, HttpBearer, django_auth
from rest_framework.authtoken.models import Token

from idempotency_django.decorators import idempotency_exempt
from idempotency_django.decorators import idempotent as core_idempotent
from idempotency_django.ninja import auth_principal, idempotent
from tests.testapp.models import Booking

#: A paused operation waits here until a test sets it.
RELEASE = threading.Event()
#: ... and sets this once it has booked.
PAUSED = threading.Event()


class BearerAuth(HttpBearer):
    """``Authorization: Bearer <DRF token key>``: the token's user."""

    def authenticate(self, request: HttpRequest, token: str) -> User | None:
        found = Token.objects.select_related("user").filter(key=token).first()
        return found.user if found is not None else None


class AsyncBearerAuth(HttpBearer):
    async def authenticate(self, request: HttpRequest, token: str) -> User | None:
        found = await Token.objects.select_related("user").filter(key=token).afirst()
        return found.user if found is not None else None


class KeyAuth(APIKeyHeader):
    """``X-API-Key: <key>``: the key itself (named by its digest)."""

    param_name = "X-API-Key"

    def authenticate(self, request: HttpRequest, key: str | None) -> str | None:
        return key if key in {"partner-one-key", "partner-two-key"} else None


class Partner:
    """A custom authentication result that names its principal."""

    def __init__(self, number: int) -> None:
        self.number = number

    @property
    def idempotency_principal(self) -> str:
        return f"partner:{self.number}"


class PartnerAuth(APIKeyHeader):
    param_name = "X-Partner"

    def authenticate(self, request: HttpRequest, key: str | None) -> Partner | None:
        return Partner(int(key)) if key and key.isdigit() else None


class AnythingAuth(APIKeyHeader):
    """Returns ``True``: names nobody, so the integration refuses to guess."""

    param_name = "X-Anything"

    def authenticate(self, request: HttpRequest, key: str | None) -> bool:
        return bool(key)


class PinAuth(APIKeyHeader):
    """``X-Pin: <6 digits>``: a short key, returned as it is (issue 37's repro)."""

    param_name = "X-Pin"

    def authenticate(self, request: HttpRequest, key: str | None) -> str | None:
        return key if key == "402917" else None


class StaffKeyAuth(APIKeyHeader):
    """Staff of the organisation "acme": returns the organisation's name."""

    param_name = "X-Staff-Key"

    def authenticate(self, request: HttpRequest, key: str | None) -> str | None:
        return "acme" if key == "staff-key" else None


class TenantKeyAuth(APIKeyHeader):
    """A tenant's integration, also of "acme": the same string, another kind of client."""

    param_name = "X-Tenant-Key"

    def authenticate(self, request: HttpRequest, key: str | None) -> str | None:
        return "acme" if key == "tenant-key" else None


class BookingIn(Schema):
    slot: str


class BookingOut(Schema):
    id: int
    slot: str
    customer: str


def book(request: HttpRequest, slot: str) -> Booking:
    auth = getattr(request, "auth", None)
    owner = auth if isinstance(auth, User) else None
    return Booking.objects.create(slot=slot, customer=auth_principal(auth) or "", owner=owner)


api = NinjaAPI(urls_namespace="ninja-tests", auth=BearerAuth())


@api.post("/bookings", response={201: BookingOut})
@idempotent
def create_booking(request: HttpRequest, payload: BookingIn) -> Any:
    """Returns a ``(status, model)`` tuple: ninja serializes it."""
    return Status(201, book(request, payload.slot))


@api.post("/tuple-bookings", response={201: BookingOut})
@idempotent
def tuple_booking(request: HttpRequest, payload: BookingIn) -> Any:
    return 201, book(request, payload.slot)


@api.post("/async-bookings", response={201: BookingOut}, auth=AsyncBearerAuth())
@idempotent
async def async_booking(request: HttpRequest, payload: BookingIn) -> Any:
    booking = await sync_to_async(book)(request, payload.slot)
    return Status(201, booking)


@api.post("/key-bookings", response={201: BookingOut}, auth=KeyAuth())
@idempotent
def key_booking(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, book(request, payload.slot))


@api.post("/pin-bookings", response={201: BookingOut}, auth=PinAuth())
@idempotent
def pin_booking(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, book(request, payload.slot))


@api.post("/acme-bookings", response={201: BookingOut}, auth=[StaffKeyAuth(), TenantKeyAuth()])
@idempotent
def acme_booking(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, book(request, payload.slot))


@api.post("/session-bookings", response={201: BookingOut}, auth=django_auth)
@idempotent
def session_booking(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, book(request, payload.slot))


@api.post("/partner-bookings", response={201: BookingOut}, auth=PartnerAuth())
@idempotent
def partner_booking(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, book(request, payload.slot))


@api.post("/anything-bookings", auth=AnythingAuth())
@idempotent
def anything_booking(request: HttpRequest, payload: BookingIn) -> Any:
    return {"id": book(request, payload.slot).pk}


@api.post("/core-decorated", response={201: BookingOut})
@core_idempotent
def core_decorated(request):  # type: ignore[no-untyped-def]
    """The Django views' ``@idempotent`` by mistake: refused before any claim or booking."""
    return 201, book(request, "core")


@api.post("/unprotected-bookings", response={201: BookingOut, 502: dict})
def unprotected_booking(request: HttpRequest, payload: BookingIn) -> Any:
    """No integration: books, then answers what a flaky gateway would (a 502)."""
    book(request, payload.slot)
    return Status(502, {"detail": "bad gateway"})


@api.post("/required-bookings", response={201: BookingOut})
@idempotent(required=True)
def required_booking(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, book(request, payload.slot))


@api.post("/atomic-failing", response={201: BookingOut, 503: dict})
@idempotent(atomic=True)
def atomic_failing(request: HttpRequest, payload: BookingIn) -> Any:
    """Books, then answers 503: the booking rolls back with the released key."""
    book(request, payload.slot)
    return Status(503, {"detail": "try again"})


@api.post("/http-error", response={201: BookingOut})
@idempotent(atomic=True)
def http_error(request: HttpRequest, payload: BookingIn) -> Any:
    """Books, then raises ninja's HttpError(409): answered 409, the booking rolled back."""
    book(request, payload.slot)
    raise HttpError(409, "slot taken")


@api.post("/unserializable", response={201: BookingOut})
@idempotent(atomic=True)
def unserializable(request: HttpRequest, payload: BookingIn) -> Any:
    """Books, then returns what the response schema refuses: a 500, nothing committed."""
    book(request, payload.slot)
    return Status(201, {"id": "not a number"})


@api.post("/unserializable-plain", response={201: BookingOut})
@idempotent
def unserializable_plain(request: HttpRequest, payload: BookingIn) -> Any:
    book(request, payload.slot)
    return Status(201, {"id": "not a number"})


@api.post("/async-unserializable", response={201: BookingOut}, auth=AsyncBearerAuth())
@idempotent
async def async_unserializable(request: HttpRequest, payload: BookingIn) -> Any:
    await sync_to_async(book)(request, payload.slot)
    return Status(201, {"id": "not a number"})


@api.post("/headers", response={201: BookingOut})
@idempotent
def with_headers(request: HttpRequest, payload: BookingIn, response: HttpResponse) -> Any:
    """Sets a header on ninja's temporal response: the stored answer keeps it."""
    response["Location"] = "/bookings/1"
    return Status(201, book(request, payload.slot))


@api.post("/paused", response={201: BookingOut})
@idempotent
def paused(request: HttpRequest, payload: BookingIn) -> Any:
    booking = book(request, payload.slot)
    PAUSED.set()
    RELEASE.wait(10)
    return Status(201, booking)


@api.post("/paused-waited", response={201: BookingOut})
@idempotent(wait_for_in_progress=10)
def paused_waited(request: HttpRequest, payload: BookingIn) -> Any:
    booking = book(request, payload.slot)
    PAUSED.set()
    RELEASE.wait(10)
    return Status(201, booking)


@api.post("/async-paused", response={201: BookingOut}, auth=AsyncBearerAuth())
@idempotent
async def async_paused(request: HttpRequest, payload: BookingIn) -> Any:
    booking = await sync_to_async(book)(request, payload.slot)
    PAUSED.set()
    await sync_to_async(RELEASE.wait)(10)
    return Status(201, booking)


@api.post("/slow-bookings", response={201: BookingOut})
@idempotent
def slow_booking(request: HttpRequest, payload: BookingIn, delay: float = 0) -> Any:
    """Books, then takes ``delay`` seconds: duplicates arrive while it runs."""
    booking = book(request, payload.slot)
    time.sleep(delay)
    return Status(201, booking)


@api.post("/async-slow-bookings", response={201: BookingOut}, auth=AsyncBearerAuth())
@idempotent
async def async_slow_booking(request: HttpRequest, payload: BookingIn, delay: float = 0) -> Any:
    booking = await sync_to_async(book)(request, payload.slot)
    await asyncio.sleep(delay)
    return Status(201, booking)


@api.post("/unprotected", response={201: BookingOut})
def unprotected(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, book(request, payload.slot))


# A router protected as a whole; one operation with its own options, one exempt.
@api.post("/windowed-bookings", response={201: BookingOut})
@idempotent(window=2)
def windowed_booking(request: HttpRequest, payload: BookingIn) -> Any:
    """A keyless retry of the same booking by the same token's user, within 2 s, replays."""
    return Status(201, book(request, payload.slot))


router = Router()
router.add_decorator(idempotent(), mode="view")


@router.post("/bookings", response={201: BookingOut})
def router_booking(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, book(request, payload.slot))


@router.post("/async-bookings", response={201: BookingOut}, auth=AsyncBearerAuth())
async def router_async_booking(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, await sync_to_async(book)(request, payload.slot))


@router.post("/required", response={201: BookingOut})
@idempotent(required=True)
def router_required(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, book(request, payload.slot))


@router.post("/exempt", response={201: BookingOut})
@idempotency_exempt
def router_exempt(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, book(request, payload.slot))


api.add_router("/router", router)

# A whole API protected at once.
whole_api = NinjaAPI(urls_namespace="ninja-whole", auth=BearerAuth())
whole_api.add_decorator(idempotent(), mode="view")


@whole_api.post("/bookings", response={201: BookingOut})
def whole_booking(request: HttpRequest, payload: BookingIn) -> Any:
    return Status(201, book(request, payload.slot))


# The router mounted a second time, in the protected API: each mount is protected on its own.
whole_api.add_router("/shared", router)
