"""Views for tests/test_downstream.py and tests/test_retain.py.

The charge views call a payment provider under ``downstream_key(request, "charge")``
when ``TESTS_PROVIDER_URL`` names one (a real server the test runs), and say
which key they used.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from ninja import NinjaAPI, Status
from ninja.errors import HttpError
from ninja.security import django_auth
from rest_framework import status, viewsets
from rest_framework.decorators import api_view
from rest_framework.response import Response

from idempotency_django import downstream_key, idempotent
from idempotency_django.drf import IdempotentMixin
from idempotency_django.ninja import idempotent as ninja_idempotent
from idempotency_django.protocol.options import ViewOptions
from idempotency_django.webhooks import deduplicate_webhook
from tests import checkpoints
from tests.testapp.models import Booking
from tests.testapp.views import _owner

# -- downstream keys -------------------------------------------------------------


def _charge(request: Any) -> HttpResponse:
    """Charge through the provider (if any) under the request's downstream key.

    With ``?crash=1`` the view fails (500) after a charge the provider made for
    the first time: its answer is lost, as when a worker dies after the call.
    """
    key = downstream_key(request, "charge")
    checkpoints.reach(request.headers.get("X-Pause-At", ""), charge_key=key)
    provider = os.environ.get("TESTS_PROVIDER_URL")
    charge: dict[str, Any] = {}
    if provider:
        call = urllib.request.Request(
            provider, data=b"{}", method="POST", headers={"Idempotency-Key": key}
        )
        with urllib.request.urlopen(call, timeout=10) as answer:
            charge = json.loads(answer.read())
        if request.GET.get("crash") and not charge["replayed"]:
            return JsonResponse({"error": "lost the provider's answer"}, status=500)
    body = {
        "charge_key": key,
        "refund_key": downstream_key(request, "refund"),
        "charge": charge.get("id"),
    }
    return JsonResponse(body, status=201)


@idempotent(required=True)
def charge(request: HttpRequest) -> HttpResponse:
    return _charge(request)


@idempotent(required=True)
def pay(request: HttpRequest) -> HttpResponse:
    """Pay the order the body names (``{"order", "amount", "card"}``) as a shop does.

    The provider's 402 (card declined) becomes this view's 402, which is not kept:
    the customer may send the fixed card under the same key. A call the provider
    refuses otherwise (e.g. a key reused with other parameters) is a 502. With
    ``?crash=1`` the answer of a first charge is lost (500), as in ``_charge``.
    """
    order = json.loads(request.body)
    # The order's id stays in the shop: two orders of one amount are one set of
    # parameters to the provider, which can only tell them apart by their key.
    params = {"amount": order["amount"], "currency": "eur", "card": order["card"]}
    call = urllib.request.Request(
        os.environ["TESTS_PROVIDER_URL"],
        data=json.dumps(params).encode(),
        method="POST",
        headers={"Idempotency-Key": downstream_key(request, "charge")},
    )
    try:
        with urllib.request.urlopen(call, timeout=10) as answer:
            charge = json.loads(answer.read())
    except urllib.error.HTTPError as error:
        with error:
            refused = json.loads(error.read())
        if error.code == 402:
            return JsonResponse({"error": "card_declined"}, status=402)
        return JsonResponse({"error": "provider_refused", "provider": refused}, status=502)
    if request.GET.get("crash") and not charge["replayed"]:
        return JsonResponse({"error": "lost the provider's answer"}, status=500)
    return JsonResponse({"charge": charge["id"]}, status=201)


@idempotent(required=True)
async def async_charge(request: HttpRequest) -> HttpResponse:
    """No provider call: the key the view would send, from an ``async def`` view."""
    return JsonResponse({"charge_key": downstream_key(request, "charge")}, status=201)


@idempotent(window=60)
def window_charge(request: HttpRequest) -> HttpResponse:
    """Keyless requests under a duplicate window."""
    return _charge(request)


def middleware_charge(request: HttpRequest) -> HttpResponse:
    """Protected by the middleware only."""
    return _charge(request)


@api_view(["POST"])
@idempotent(required=True)
def api_charge(request):  # type: ignore[no-untyped-def]
    return _charge(request)


@deduplicate_webhook(id_header="webhook-id")
def webhook_charge(request: HttpRequest, token: str) -> HttpResponse:
    return _charge(request)


charges_api = NinjaAPI(urls_namespace="downstream-tests", auth=django_auth)


@charges_api.post("/charges")
@ninja_idempotent(required=True)
def ninja_charge(request: HttpRequest) -> HttpResponse:
    return _charge(request)


# -- retention decisions ---------------------------------------------------------

#: What every retain function below was asked: (status, exception type name or None).
ASKED: list[tuple[int, str | None]] = []


def _asked(response: HttpResponseBase, exception: Exception | None) -> None:
    ASKED.append((response.status_code, type(exception).__name__ if exception else None))


def keep_deletes_not_found(
    request: HttpRequest, response: HttpResponseBase, exception: Exception | None
) -> bool:
    """A DELETE of what is not there is done: keep its 404 (and every 2xx/3xx)."""
    _asked(response, exception)
    if request.method == "DELETE" and response.status_code == 404:
        return True
    return response.status_code < 400


def never_keep_unprocessable(
    request: HttpRequest, response: HttpResponseBase, exception: Exception | None
) -> bool:
    """Keep 2xx-4xx, except a 422: the client may fix the entity and retry with the key."""
    _asked(response, exception)
    return response.status_code != 422


def keep_everything(
    request: HttpRequest, response: HttpResponseBase, exception: Exception | None
) -> bool:
    """Says yes to anything: a 5xx must still never be kept."""
    _asked(response, exception)
    return True


def broken_retain(
    request: HttpRequest, response: HttpResponseBase, exception: Exception | None
) -> bool:
    raise LookupError("a bug in the project's retain function")


def booking_answer(request: HttpRequest) -> HttpResponse:
    """Books; answers ``?status=`` (201 by default). A DELETE of ``?missing=1`` raises 404."""
    if request.method == "DELETE" and request.GET.get("missing"):
        raise Http404("no such booking")
    booking = Booking.objects.create(slot="retain", owner=_owner(request))
    return JsonResponse({"id": booking.pk}, status=int(request.GET.get("status", 201)))


@idempotent(retain=never_keep_unprocessable)
def validated_booking(request: HttpRequest) -> HttpResponse:
    return booking_answer(request)


@idempotent(retain="tests.testapp.downstream_views.keep_everything")
def greedy_booking(request: HttpRequest) -> HttpResponse:
    return booking_answer(request)


class RetainingBookingViewSet(IdempotentMixin, viewsets.ViewSet):
    """DELETE of an unknown booking raises DRF's 404; POST answers ``?status=``."""

    idempotency_options = ViewOptions(retain=keep_deletes_not_found)

    def create(self, request):  # type: ignore[no-untyped-def]
        booking = Booking.objects.create(slot="retain", owner=_owner(request))
        return Response({"id": booking.pk}, status=int(request.GET.get("status", 201)))

    def destroy(self, request, pk=None):  # type: ignore[no-untyped-def]
        Booking.objects.create(slot="delete-attempt", owner=_owner(request))
        deleted, _ = Booking.objects.filter(pk=pk, slot="retain").delete()
        if not deleted:
            raise Http404("no such booking")
        return Response(status=status.HTTP_204_NO_CONTENT)


retaining_api = NinjaAPI(urls_namespace="retain-tests", auth=django_auth)


@retaining_api.delete("/bookings/{pk}", response={204: None})
@ninja_idempotent(retain=keep_deletes_not_found)
def ninja_delete_booking(request: HttpRequest, pk: int) -> Any:
    Booking.objects.create(slot="delete-attempt", owner=_owner(request))
    deleted, _ = Booking.objects.filter(pk=pk, slot="retain").delete()
    if not deleted:
        raise HttpError(404, "no such booking")
    return Status(204, None)


@retaining_api.post("/bookings", response={201: dict, 404: dict})
@ninja_idempotent(retain=keep_deletes_not_found)
def ninja_create_booking(request: HttpRequest, status: int = 201) -> Any:
    booking = Booking.objects.create(slot="retain", owner=_owner(request))
    return Status(status, {"id": booking.pk})
