"""The project's views: HTML forms, template responses, class-based views, gated views.

Each successful call creates exactly one Booking, so counting bookings counts runs.
"""

from __future__ import annotations

import threading

from django import forms
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.utils.translation import get_language
from django.views.generic import FormView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency_django import idempotent
from tests.testapp.models import Booking

#: Seconds a gated request waits for its gate before giving up: a guard
#: against a test that hangs, never a condition a test asserts on.
HANG_GUARD = 60


class BookingForm(forms.Form):
    slot = forms.CharField(max_length=64)
    customer = forms.CharField(max_length=128)
    attachment = forms.FileField(required=False)


def _owner(request: HttpRequest | Request) -> User | None:
    user: AbstractBaseUser | AnonymousUser = request.user
    return user if isinstance(user, User) else None


def _book(request: HttpRequest, slot: str, customer: str = "") -> Booking:
    return Booking.objects.create(
        slot=slot,
        customer=customer,
        location=request.headers.get("X-Location-Id", ""),
        owner=_owner(request),
    )


# -- HTML forms ------------------------------------------------------------------


def book_from_form(request: HttpRequest) -> HttpResponse:
    """GET: the booking form (it sets the CSRF cookie). POST: book from its fields."""
    if request.method != "POST":
        return TemplateResponse(request, "real_stack/booking_form.html", {"form": BookingForm()})
    form = BookingForm(request.POST, request.FILES)
    if not form.is_valid():
        return JsonResponse({"errors": form.errors}, status=400)
    booking = _book(request, form.cleaned_data["slot"], form.cleaned_data["customer"])
    attachment = form.cleaned_data["attachment"]
    return JsonResponse(
        {
            "id": booking.pk,
            "slot": booking.slot,
            "attachment": None if attachment is None else attachment.read().decode(),
        },
        status=201,
    )


# -- template responses and class-based views ---------------------------------


def book_with_template(request: HttpRequest) -> HttpResponse:
    """A lazy response: the template renders after the view has returned."""
    booking = _book(request, request.POST.get("slot", ""))
    return TemplateResponse(request, "real_stack/booked.html", {"booking": booking}, status=201)


decorated_book_with_template = idempotent(book_with_template)


class BookingFormView(FormView):  # type: ignore[type-arg]
    """The usual create page: an invalid form shows it again (200), a valid one redirects."""

    form_class = BookingForm
    template_name = "real_stack/booking_form.html"

    def form_valid(self, form: BookingForm) -> HttpResponse:
        booking = _book(self.request, form.cleaned_data["slot"], form.cleaned_data["customer"])
        return HttpResponseRedirect(f"/real/bookings/{booking.pk}/")


DecoratedBookingFormView = idempotent(BookingFormView)


# -- for the middleware orders ------------------------------------------------------


class QueuedForLater(Exception):
    """Raised by a view after its work; the project's middleware answers 202 for it."""


def book_then_queue(request: HttpRequest) -> HttpResponse:
    _book(request, "queued")
    raise QueuedForLater


def book_with_receipt(request: HttpRequest) -> HttpResponse:
    """A plain-text receipt, long enough for GZipMiddleware to compress it."""
    booking = _book(request, request.POST.get("slot", ""))
    receipt = [
        f"Receipt for booking #{booking.pk}",
        f"Slot: {booking.slot}",
        f"Language: {get_language()}",
        "Keep this receipt. A retry of the same request with the same Idempotency-Key "
        "shows it again instead of booking a second time, for as long as it is retained.",
        "Cancellations: free until 24 hours before the slot. Changes: free until 24 hours "
        "before the slot. Questions: reply to the confirmation email of this booking.",
    ]
    return HttpResponse("\n".join(receipt), status=201, content_type="text/plain; charset=utf-8")


# -- gated views: a request held inside its view until the test opens the gate ----------


class Gate:
    """Holds requests inside a gated view until the test opens it.

    A request that reaches the view has claimed its key and, under
    ``ATOMIC_REQUESTS``, holds its transaction open: the moment at which a
    duplicate must be answered, forced deterministically rather than by timing.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.entered = threading.Event()
        self._opened = threading.Event()

    def pass_through(self) -> None:
        self.entered.set()
        if not self._opened.wait(HANG_GUARD):
            raise RuntimeError(f"the gate {self.name!r} was never opened")

    def wait_until_entered(self) -> None:
        if not self.entered.wait(HANG_GUARD):
            raise AssertionError(f"no request reached the view behind the gate {self.name!r}")

    def open(self) -> None:
        self._opened.set()


GATES: dict[str, Gate] = {}


def new_gate(name: str) -> Gate:
    GATES[name] = Gate(name)
    return GATES[name]


def gated_booking(request: HttpRequest, gate: str) -> HttpResponse:
    """A plain view, protected by the middleware."""
    booking = _book(request, f"gated-{gate}")
    GATES[gate].pass_through()
    return JsonResponse({"id": booking.pk}, status=201)


@idempotent(atomic=True)
def gated_atomic_booking(request: HttpRequest, gate: str) -> HttpResponse:
    booking = _book(request, f"gated-{gate}")
    GATES[gate].pass_through()
    return JsonResponse({"id": booking.pk}, status=201)


@idempotent
class GatedApiBooking(APIView):
    def post(self, request: Request, gate: str) -> Response:
        booking = Booking.objects.create(slot=f"gated-{gate}", owner=_owner(request))
        GATES[gate].pass_through()
        return Response({"id": booking.pk}, status=201)


def booking_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse({"id": pk})
