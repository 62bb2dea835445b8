"""The example's booking endpoints, tested with idempotency-django's pytest helpers.

Run them with ``pytest example_project`` from the repository's root. The
``idempotency_store`` fixture empties the store around every test (conftest.py).
"""

from base64 import b64encode

import pytest
from django.test import Client
from rest_framework.test import APIClient

from bookings.models import Booking
from idempotency_django.testing import assert_idempotent

BOOKING = {"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"}


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def api(alice):
    client = APIClient()
    client.force_authenticate(alice)
    return client


def test_booking_through_the_api_is_idempotent(api):
    first = assert_idempotent(api, "POST", "/api/bookings/", BOOKING, HTTP_X_LOCATION_ID="portland")

    booking = Booking.objects.get()  # the duplicate and the retry booked nothing
    assert first.status_code == 201
    assert first.json() == {
        "id": booking.pk,
        "slot": "2026-07-30T09:00:00Z",
        "customer": "Dana Whitfield",
        "location": "portland",
    }


def test_changing_and_cancelling_a_booking_are_idempotent(api, alice):
    booking = Booking.objects.create(owner=alice, slot=BOOKING["slot"], location="portland")
    url = f"/api/bookings/{booking.pk}/"

    changed = assert_idempotent(
        api, "PATCH", url, {"customer": "Dana W."}, HTTP_X_LOCATION_ID="portland"
    )
    assert changed.json()["customer"] == "Dana W."
    cancelled = assert_idempotent(api, "DELETE", url, HTTP_X_LOCATION_ID="portland")
    assert cancelled.status_code == 204
    assert not Booking.objects.exists()


def test_a_client_with_basic_credentials(alice, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast
    alice.set_password("alice-password")
    alice.save()
    # As the README's curl examples send them; every request of the check carries them.
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Basic " + b64encode(b"alice:alice-password").decode())
    assert_idempotent(api, "POST", "/api/bookings/", BOOKING)
    assert Booking.objects.count() == 1


def test_booking_through_the_plain_view_is_idempotent(alice):
    client = Client()
    client.force_login(alice)  # keys are scoped per user

    assert_idempotent(client, "POST", "/plain/bookings/", BOOKING)

    assert Booking.objects.count() == 1


@pytest.mark.parametrize("attempt", [1, 2])
def test_every_test_starts_with_an_empty_store(api, attempt):
    # The same user id and key in both runs: without the idempotency_store fixture,
    # the second would be a replay of the first on Redis.
    response = api.post("/api/bookings/", BOOKING, format="json", HTTP_IDEMPOTENCY_KEY="fixed")
    assert response.status_code == 201
    assert "Idempotency-Replayed" not in response


def test_listing_bookings(no_idempotency, api):
    # The booking page sends a key with every POST. This test is about the list,
    # not retries: with the protection off, the same key books twice.
    for customer in ("Dana", "Eli"):
        api.post(
            "/api/bookings/",
            {**BOOKING, "customer": customer},
            format="json",
            HTTP_IDEMPOTENCY_KEY="key-from-the-page",
        )

    listed = api.get("/api/bookings/").json()

    assert [booking["customer"] for booking in listed] == ["Dana", "Eli"]


def test_booking_through_the_ninja_api_is_idempotent(alice, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast
    alice.set_password("alice-password")
    alice.save()
    basic = "Basic " + b64encode(b"alice:alice-password").decode()

    first = assert_idempotent(
        Client(), "POST", "/ninja/bookings", BOOKING,
        HTTP_AUTHORIZATION=basic, HTTP_X_LOCATION_ID="portland",
    )  # fmt: skip

    booking = Booking.objects.get()  # the duplicate and the retry booked nothing
    assert first.status_code == 201
    assert first.json()["id"] == booking.pk
    assert booking.owner == alice
    assert booking.location == "portland"


def test_the_ninja_api_refuses_a_caller_without_credentials_and_keeps_nothing():
    response = Client().post(
        "/ninja/bookings", BOOKING, content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="anonymous",
    )  # fmt: skip
    assert response.status_code == 401
    assert not Booking.objects.exists()
