"""The booking operation over django-ninja, next to the DRF viewset.

ninja authenticates inside its view (``auth=`` below), after every middleware:
``idempotency_django.ninja.idempotent`` claims the key after that, scoped by
``request.auth``, the user ninja authenticated.
"""

from datetime import datetime

from django.contrib.auth import authenticate
from ninja import NinjaAPI, Schema, Status
from ninja.security import HttpBasicAuth, django_auth

from bookings.models import Booking
from bookings.views import location_of, simulate_slow_work
from idempotency_django.ninja import idempotent


class BasicAuth(HttpBasicAuth):
    """HTTP Basic, as the DRF API accepts it: the user, or None (401)."""

    def authenticate(self, request, username, password):
        user = authenticate(request, username=username, password=password)
        return user if user is not None and user.is_active else None


api = NinjaAPI(
    title="Bookings (django-ninja)",
    urls_namespace="ninja",
    auth=[BasicAuth(), django_auth],  # request.auth: the user either one authenticated
)


class BookingIn(Schema):
    slot: datetime
    customer: str = ""


class BookingOut(Schema):
    id: int
    slot: datetime
    customer: str
    location: str


@api.post("/bookings", response={201: BookingOut})
@idempotent  # below the route: the key is claimed after ninja's auth
def create_booking(request, payload: BookingIn):
    simulate_slow_work()
    booking = Booking.objects.create(
        owner=request.auth, location=location_of(request), **payload.dict()
    )
    return Status(201, booking)  # turned into ninja's response before it is stored
