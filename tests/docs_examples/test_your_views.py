"""Tests of a protected view with idempotency-django's test helpers, as docs/testing.md
shows them.

They run in this repository's suite against the small view below (in your project,
your own view and URLconf). The sections between the ``--8<--`` markers are the ones
the page includes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, TestCase, override_settings
from django.urls import path
from django.views.decorators.csrf import ensure_csrf_cookie

from idempotency_django.models import IdempotencyRecord
from idempotency_django.testing import assert_idempotent, clear_store, idempotency_disabled
from tests.testapp.models import Booking


def create_booking(request: HttpRequest) -> JsonResponse:
    """A plain view; IdempotencyMiddleware protects it (see the settings)."""
    booking = Booking.objects.create(
        slot=json.loads(request.body)["slot"],
        owner=request.user,
        location=request.headers.get("X-Location-Id", ""),
    )
    return JsonResponse({"id": booking.pk, "slot": booking.slot}, status=201)


@ensure_csrf_cookie
def booking_page(request: HttpRequest) -> HttpResponse:
    return HttpResponse("<form>...</form>")


urlpatterns = [path("bookings/", create_booking), path("book/", booking_page)]
pytestmark = pytest.mark.urls(__name__)


@pytest.fixture
def dana(django_user_model: Any) -> User:
    return django_user_model.objects.create_user("dana")


# --8<-- [start:assert_idempotent]
@pytest.mark.django_db
def test_booking_is_idempotent(dana: User) -> None:
    client = Client()
    client.force_login(dana)  # keys are scoped per user

    first = assert_idempotent(client, "POST", "/bookings/", {"slot": "2026-07-30T09:00"})

    assert first.status_code == 201
    assert Booking.objects.count() == 1  # the view ran once


# --8<-- [end:assert_idempotent]


# --8<-- [start:options]
@pytest.mark.django_db
def test_with_a_key_a_header_and_a_body_of_bytes(dana: User) -> None:
    client = Client()
    client.force_login(dana)

    assert_idempotent(
        client,
        "POST",
        "/bookings/",
        b'{"slot": "2026-07-30T09:00"}',
        other_data=b'{"slot": "2026-07-31T09:00"}',  # for the reused-key check
        key="booking-1",
        HTTP_X_LOCATION_ID="portland",  # sent with every request
    )

    assert Booking.objects.get().location == "portland"


# --8<-- [end:options]


# --8<-- [start:csrf]
@pytest.mark.django_db
def test_with_csrf_enforced(dana: User) -> None:
    # The test client skips CSRF checks unless asked; a browser's request does not.
    client = Client(enforce_csrf_checks=True)
    client.force_login(dana)
    client.get("/book/")  # the page that sets the csrftoken cookie, as in a browser
    token = client.cookies["csrftoken"].value
    body = json.dumps({"slot": "2026-07-30T09:00"})
    headers = {"Idempotency-Key": "booking-1"}

    refused = client.post("/bookings/", body, "application/json", headers=headers)
    assert refused.status_code == 403  # no token: refused, and not stored

    # The same key works once the token is sent.
    assert_idempotent(
        client,
        "POST",
        "/bookings/",
        {"slot": "2026-07-30T09:00"},
        key="booking-1",
        HTTP_X_CSRFTOKEN=token,
    )


# --8<-- [end:csrf]


# --8<-- [start:testcase]
@override_settings(ROOT_URLCONF=__name__)  # your project's URLconf needs none
class BookingTests(TestCase):
    def setUp(self) -> None:
        clear_store()  # a Redis store keeps its keys across tests
        self.client.force_login(User.objects.create_user("erin"))

    def test_booking_is_idempotent(self) -> None:
        assert_idempotent(self.client, "POST", "/bookings/", {"slot": "2026-07-30T09:00"})
        self.assertEqual(Booking.objects.count(), 1)

    @idempotency_disabled()
    def test_booking_twice_with_one_key(self) -> None:
        for _ in range(2):
            self.client.post(
                "/bookings/",
                {"slot": "2026-07-30T09:00"},
                "application/json",
                headers={"Idempotency-Key": "booking-1"},
            )
        self.assertEqual(Booking.objects.count(), 2)
        self.assertFalse(IdempotencyRecord.objects.exists())


# --8<-- [end:testcase]
