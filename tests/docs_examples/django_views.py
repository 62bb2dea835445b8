"""Plain Django views like docs/django.md's (Sybil runs the page's own in the quickstart's
project), on the test project's Booking; tests/test_docs.py drives them."""

from __future__ import annotations

import json

from django.http import JsonResponse
from django.views import View

from idempotency_django import idempotency_exempt, idempotent
from tests.testapp.models import Booking


def create_booking(request):
    """Protected by IdempotencyMiddleware alone: nothing to add to the view."""
    payload = json.loads(request.body)
    booking = Booking.objects.create(slot=payload["slot"], owner=request.user)
    return JsonResponse({"id": booking.pk, "slot": booking.slot}, status=201)


@idempotent(required=True, retention=3600, atomic=True)
def pay_invoice(request, invoice_id):
    """A key is required here; the payment and its stored response commit together."""
    Booking.objects.create(slot=f"invoice-{invoice_id}", owner=request.user)
    return JsonResponse({"invoice": invoice_id, "paid": True}, status=201)


@idempotent(retain_client_errors=True)
def redeem_voucher(request):
    """A 422 (voucher expired) is replayed too: retrying cannot change it."""
    return JsonResponse({"detail": "This voucher has expired."}, status=422)


@idempotent
class CancelBooking(View):
    def post(self, request, pk):
        Booking.objects.filter(pk=pk, owner=request.user).update(customer="cancelled")
        return JsonResponse({"cancelled": pk})


@idempotency_exempt
def track_click(request):
    """Counting every request is the point here: never deduplicated."""
    Booking.objects.create(slot="click")
    return JsonResponse({}, status=204)


from idempotency_django.protocol.fingerprint import json_fields  # noqa: E402


@idempotent(fingerprint=json_fields("slot", "customer"))
def book_slot(request):
    """The app also sends a fresh "sent_at" with every attempt: only these fields count."""
    payload = json.loads(request.body)
    booking = Booking.objects.create(slot=payload["slot"], customer=payload["customer"])
    return JsonResponse({"id": booking.pk}, status=201)


def retryable_unprocessable(request, response, exception):
    """A 422 here says "fix the form and send it again": never keep it; keep the rest."""
    return response.status_code != 422


@idempotent(retain=retryable_unprocessable)
def submit_application(request):
    payload = json.loads(request.body)
    if not payload.get("name"):
        return JsonResponse({"detail": "A name is required."}, status=422)
    Booking.objects.create(slot="application", customer=payload["name"], owner=request.user)
    return JsonResponse({"submitted": True}, status=201)
