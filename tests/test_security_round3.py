"""Issue 24, items 7-10: each finding reproduced through a real store or a real server.

Every test here failed on 0d3b924; its docstring says why.
"""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.contrib.sessions.models import Session
from django.test import Client, override_settings

from idempotency_django.models import IdempotencyRecord
from tests.testapp.models import Booking

# -- 7. guest sessions -------------------------------------------------------------

SIGNED_COOKIES = "django.contrib.sessions.backends.signed_cookies"


def guest_order(client: Client, key: str = "order-1") -> object:
    return client.post("/plain/guest/", {"slot": "guest"}, HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.django_db
@override_settings(IDEMPOTENCY={"ANONYMOUS": "session"}, SESSION_ENGINE=SIGNED_COOKIES)
def test_two_signed_cookie_guests_in_the_same_second_are_two_guests() -> None:
    """0d3b924 named both by their identical empty signed cookie.

    The second guest was answered with the first one's order.
    """
    for _ in range(5):  # the two first requests must fall in the same second
        Booking.objects.all().delete()
        started = int(time.time())
        first, second = Client(), Client()
        one, two = guest_order(first), guest_order(second)
        if int(time.time()) == started:
            break
    else:
        pytest.fail("could not make two requests within one second")
    assert one.status_code == 201 and two.status_code == 201  # type: ignore[attr-defined]
    assert "Idempotency-Replayed" not in two  # type: ignore[operator]
    assert Booking.objects.count() == 2
    assert first.cookies[settings.SESSION_COOKIE_NAME].value != (
        second.cookies[settings.SESSION_COOKIE_NAME].value
    )
    # Each guest's retry is still the replay of its own order.
    assert guest_order(first)["Idempotency-Replayed"] == "true"  # type: ignore[index]
    assert guest_order(second)["Idempotency-Replayed"] == "true"  # type: ignore[index]
    assert Booking.objects.count() == 2


@pytest.mark.django_db
@override_settings(IDEMPOTENCY={"ANONYMOUS": "session"}, SESSION_ENGINE=SIGNED_COOKIES)
def test_a_signed_cookie_guest_stays_one_guest_when_the_session_changes() -> None:
    """The principal must not be the cookie itself, which changes with every session write."""
    guest = Client()
    assert guest_order(guest).status_code == 201  # type: ignore[attr-defined]
    session = guest.session
    session["cart"] = ["a book"]  # the shop writes to the session: a new cookie
    session.save()
    guest.cookies[settings.SESSION_COOKIE_NAME] = session.session_key
    assert guest_order(guest)["Idempotency-Replayed"] == "true"  # type: ignore[index]
    assert Booking.objects.count() == 1


@pytest.mark.django_db
@override_settings(IDEMPOTENCY={"ANONYMOUS": "session"})
def test_a_guest_request_refused_by_csrf_leaves_no_session() -> None:
    """0d3b924 saved a session for each keyed guest request before CSRF refused it.

    (300 refused requests, 300 session rows.)
    """
    guest = Client(enforce_csrf_checks=True)
    for n in range(20):
        refused = guest.post("/plain/bookings/", {"slot": "x"}, HTTP_IDEMPOTENCY_KEY=f"k-{n}")
        assert refused.status_code == 403
    assert Session.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0
    assert Booking.objects.count() == 0
    assert settings.SESSION_COOKIE_NAME not in guest.cookies


@pytest.mark.django_db
@override_settings(IDEMPOTENCY={"ANONYMOUS": "session"})
def test_a_guest_request_that_passes_csrf_is_protected() -> None:
    """The early CSRF check lets a genuine form through: a session, then a replay."""
    guest = Client(enforce_csrf_checks=True)
    token = "a" * 32
    guest.cookies[settings.CSRF_COOKIE_NAME] = token
    headers = {"HTTP_IDEMPOTENCY_KEY": "form-1", "HTTP_X_CSRFTOKEN": token}
    first = guest.post("/plain/bookings/", {"slot": "x"}, "application/json", **headers)
    assert first.status_code == 201
    assert Session.objects.count() == 1
    again = guest.post("/plain/bookings/", {"slot": "x"}, "application/json", **headers)
    assert again["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1
