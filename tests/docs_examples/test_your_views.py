"""Tests of a protected view with pytest-django, as docs/testing.md shows them.

They run in this repository's suite against the small view below (in your project,
your own view and URLconf). The sections between the ``--8<--`` markers are the ones
the page includes.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.urls import path
from django.views.decorators.csrf import ensure_csrf_cookie

from tests.testapp.models import Booking


def book_slot(slot: str, user: User) -> Booking:
    """The work the view does; the in-progress test holds it up."""
    return Booking.objects.create(slot=slot, owner=user)


def create_booking(request: HttpRequest) -> JsonResponse:
    """A plain view; IdempotencyMiddleware protects it (see the settings)."""
    booking = book_slot(json.loads(request.body)["slot"], request.user)  # type: ignore[arg-type]
    return JsonResponse({"id": booking.pk, "slot": booking.slot}, status=201)


@ensure_csrf_cookie
def booking_page(request: HttpRequest) -> HttpResponse:
    return HttpResponse("<form>...</form>")


urlpatterns = [path("bookings/", create_booking), path("book/", booking_page)]
pytestmark = pytest.mark.urls(__name__)


# --8<-- [start:helpers]
@pytest.fixture
def dana(django_user_model: Any) -> User:
    return django_user_model.objects.create_user("dana", password="a-test-password")


def logged_in(user: User, **client_options: Any) -> Client:
    # Log in: keys are scoped per user, and an anonymous keyed request runs
    # unprotected by default (nothing stored, nothing replayed).
    client = Client(**client_options)
    client.force_login(user)
    return client


def book(client: Client, key: str, slot: str, **headers: str) -> Any:
    return client.post(
        "/bookings/",
        json.dumps({"slot": slot}),
        content_type="application/json",
        headers={"Idempotency-Key": key, **headers},
    )


# --8<-- [end:helpers]


# --8<-- [start:replay]
@pytest.mark.django_db
def test_a_retry_is_replayed(dana: User) -> None:
    client = logged_in(dana)
    first = book(client, "booking-1", "2026-07-30T09:00")
    retry = book(client, "booking-1", "2026-07-30T09:00")

    assert first.status_code == retry.status_code == 201
    assert retry.content == first.content
    assert retry["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1  # the view ran once


# --8<-- [end:replay]


# --8<-- [start:reused]
@pytest.mark.django_db
def test_a_key_reused_for_another_request_is_refused(dana: User) -> None:
    client = logged_in(dana)
    book(client, "booking-1", "2026-07-30T09:00")
    other = book(client, "booking-1", "2026-07-31T09:00")

    assert other.status_code == 409
    assert other["Content-Type"] == "application/problem+json"
    assert other.json()["code"] == "idempotency_key_reused"
    assert Booking.objects.count() == 1


# --8<-- [end:reused]


# --8<-- [start:in_progress]
@pytest.mark.django_db(transaction=True)  # the thread must see the committed claim
def test_a_duplicate_while_the_first_runs_gets_409(
    dana: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, finish = threading.Event(), threading.Event()

    def slow_book_slot(slot: str, user: User) -> Booking:
        running.set()  # the key is claimed and the view runs...
        finish.wait(10)  # ...until the duplicate has its answer
        return Booking.objects.create(slot=slot, owner=user)

    monkeypatch.setattr(f"{__name__}.book_slot", slow_book_slot)  # "myapp.views.book_slot"
    answers = {}

    def first_request() -> None:
        answers["first"] = book(logged_in(dana), "booking-1", "2026-07-30T09:00")
        connection.close()  # this thread's own database connection

    thread = threading.Thread(target=first_request)
    thread.start()
    assert running.wait(10)
    duplicate = book(logged_in(dana), "booking-1", "2026-07-30T09:00")
    finish.set()
    thread.join()

    assert duplicate.status_code == 409
    assert duplicate.json()["code"] == "idempotency_key_in_progress"
    assert int(duplicate["Retry-After"]) >= 1
    assert answers["first"].status_code == 201
    assert Booking.objects.count() == 1


# --8<-- [end:in_progress]


# --8<-- [start:csrf]
@pytest.mark.django_db
def test_with_csrf_enforced(dana: User) -> None:
    # The test client skips CSRF checks unless asked; a browser's request does not.
    client = logged_in(dana, enforce_csrf_checks=True)
    client.get("/book/")  # the page that sets the csrftoken cookie, as in a browser
    token = client.cookies["csrftoken"].value

    refused = book(client, "booking-1", "2026-07-30T09:00")  # no token
    first = book(client, "booking-1", "2026-07-30T09:00", **{"X-CSRFToken": token})
    retry = book(client, "booking-1", "2026-07-30T09:00", **{"X-CSRFToken": token})

    assert refused.status_code == 403  # not stored: the key stays free
    assert first.status_code == 201 and "Idempotency-Replayed" not in first
    assert retry["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1


# --8<-- [end:csrf]
