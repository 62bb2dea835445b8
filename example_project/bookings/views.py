"""The same booking operation over DRF and plain Django (the webhook receivers: webhooks.py)."""

import json
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_POST
from rest_framework import viewsets

from bookings.forms import BookingForm
from bookings.models import Booking
from bookings.serializers import BookingSerializer
from idempotency_django import idempotent


def location_of(request: HttpRequest) -> str:
    return str(request.headers.get("X-Location-Id", "")).strip()


#: How long a booking waits at EXAMPLE_BOOKING_GATE at most: a test that never opens
#: it holds a request for a minute, not for ever.
GATE_TIMEOUT_S = 60


def simulate_slow_work() -> None:
    """Creating a booking takes EXAMPLE_BOOKING_DELAY_MS (0 by default), and waits
    until the file EXAMPLE_BOOKING_GATE names exists (when set; at most GATE_TIMEOUT_S)."""
    if settings.EXAMPLE_BOOKING_GATE:
        gate = Path(settings.EXAMPLE_BOOKING_GATE)
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    if settings.EXAMPLE_BOOKING_DELAY_MS > 0:
        time.sleep(settings.EXAMPLE_BOOKING_DELAY_MS / 1000)


@idempotent  # create, update, partial_update and destroy
class BookingViewSet(viewsets.ModelViewSet):
    serializer_class = BookingSerializer
    # Ids a 64-bit column holds: a longer one is 404 here, not 500 (OverflowError)
    # from SQLite on Django 4.2.
    lookup_value_regex = r"[0-9]{1,18}"

    def get_queryset(self):
        # The caller's bookings in the location the request names.
        return Booking.objects.filter(owner=self.request.user, location=location_of(self.request))

    def perform_create(self, serializer):
        simulate_slow_work()
        serializer.save(owner=self.request.user, location=location_of(self.request))


@require_POST
def plain_create_booking(request):
    """A plain Django view: IdempotencyMiddleware protects it, no decorator needed."""
    if not request.user.is_authenticated:
        return JsonResponse({"detail": "Log in first."}, status=401)
    try:
        payload = json.loads(request.body)
    except ValueError:
        return JsonResponse({"detail": "The body must be JSON."}, status=400)
    form = BookingForm(payload if isinstance(payload, dict) else {})
    if not form.is_valid():
        return JsonResponse({"errors": form.errors}, status=400)
    simulate_slow_work()
    booking = form.save(commit=False)
    booking.owner = request.user
    booking.location = location_of(request)
    booking.save()
    return JsonResponse(BookingSerializer(booking).data, status=201)


@login_required
@ensure_csrf_cookie
def index(request: HttpRequest) -> HttpResponse:
    """The booking page: a form whose Idempotency-Key is made once per form."""
    return render(request, "bookings/index.html", {"location": "portland"})
