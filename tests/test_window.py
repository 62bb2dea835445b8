"""The duplicate window: a keyless retry of an authenticated request, within the view's
``window``, is answered as the first was (issue 39, part 2).

The view (tests/testapp/views.py ``windowed_booking``) books from a form and has
``@idempotent(window=2)``. The first tests use Django's test client; the last ones a
real uvicorn, with sessions and CSRF enforced, a double submit, an agent-like retry loop
and the window's edge.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from rest_framework.test import APIClient

from idempotency_django import ViewOptions
from tests import servers
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/window/bookings/"


def submit(client: Client, slot: str = "2026-07-30T09:00:00Z", **extra: Any):  # type: ignore[no-untyped-def]
    return client.post(URL, {"slot": slot}, **extra)


def test_a_keyless_resubmission_within_the_window_is_answered_as_the_first(
    alice_client: Client,
) -> None:
    first, again = submit(alice_client), submit(alice_client)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json() == first.json()
    assert again["Idempotency-Replayed"] == "true" and again["Idempotency-Window"] == "2"
    assert "Idempotency-Window" not in first
    assert Booking.objects.count() == 1


def test_another_request_or_another_user_is_not_a_duplicate(
    alice_client: Client, bob_client: Client
) -> None:
    submit(alice_client)
    assert "Idempotency-Replayed" not in submit(alice_client, slot="2026-07-30T10:00:00Z")
    assert "Idempotency-Replayed" not in submit(bob_client)
    assert Booking.objects.count() == 3


@pytest.mark.parametrize("anonymous", ["ignore", "session"])
def test_never_for_anonymous_requests(anonymous: str) -> None:
    guest = Client()
    with override_settings(IDEMPOTENCY={"ANONYMOUS": anonymous}):
        answers = [submit(guest), submit(guest)]
    assert [a.status_code for a in answers] == [201, 201]
    assert not any(a.has_header("Idempotency-Replayed") for a in answers)
    assert not any(a.has_header("Idempotency-Key-Ignored") for a in answers)  # no key sent
    assert Booking.objects.count() == 2


def test_keyed_requests_are_untouched(alice_client: Client) -> None:
    keyed = submit(alice_client, HTTP_IDEMPOTENCY_KEY="k-1")
    replay = submit(alice_client, HTTP_IDEMPOTENCY_KEY="k-1")
    assert replay["Idempotency-Replayed"] == "true" and "Idempotency-Window" not in replay
    # The same form without a key is another operation: its key is not the client's.
    assert "Idempotency-Replayed" not in submit(alice_client)
    assert keyed.status_code == 201 and Booking.objects.count() == 2


def test_the_same_option_on_a_drf_viewset(alice: User) -> None:
    api = APIClient()
    api.force_authenticate(alice)
    body = json.dumps({"slot": "2026-07-30T09:00:00Z"})
    first, again = (
        api.post("/api/windowed-bookings/", body, content_type="application/json") for _ in range(2)
    )
    assert first.status_code == 201 and again["Idempotency-Window"] == "2"
    assert again.json() == first.json() and Booking.objects.count() == 1


def test_a_window_is_whole_seconds_from_one() -> None:
    with pytest.raises(ValueError, match="whole number of seconds"):
        ViewOptions(window=0)


# -- through a real server -----------------------------------------------------------------


@pytest.fixture(scope="module")
def server(django_db_setup: None) -> Iterator[str]:
    with servers.test_project_on_uvicorn() as url:
        yield url


def form(user: User, slot: str) -> tuple[bytes, dict[str, str]]:
    body = urllib.parse.urlencode({"slot": slot}).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    return body, {**headers, **servers.logged_in_headers(user)}


@pytest.mark.services
def test_a_double_submit_books_once(server: str, alice: User) -> None:
    """Two clicks 50 ms apart while the first still runs (0.5 s), then a reload."""
    body, headers = form(alice, "2026-07-30T09:00:00Z")

    def click(index: int) -> tuple[int, dict[str, str], bytes]:
        time.sleep(0.05 * index)
        return servers.post(f"{server}{URL}?delay=0.5", body, headers)

    with ThreadPoolExecutor(max_workers=2) as pool:
        first, second = pool.map(click, range(2))
    assert (first[0], second[0]) == (201, 409)
    reload = servers.post(f"{server}{URL}?delay=0.5", body, headers)
    assert reload[0] == 201 and reload[1]["Idempotency-Window"] == "2"
    assert reload[2] == first[2]
    assert Booking.objects.filter(owner=alice).count() == 1


@pytest.mark.services
def test_an_agent_that_retries_a_timed_out_call_books_once(server: str, bob: User) -> None:
    """A tool call times out after 0.2 s (the work takes 0.6 s) and is sent again,
    unchanged, until an answer arrives: one booking, and the answer is its own."""
    body, headers = form(bob, "2026-07-30T11:00:00Z")
    answer = None
    for _ in range(20):
        try:
            answer = servers.post(f"{server}{URL}?delay=0.6", body, headers, timeout=0.2)
        except (TimeoutError, urllib.error.URLError):
            continue  # no answer in time: the agent sends the same call again
        if answer[0] == 201:
            break
        time.sleep(0.1)  # 409 in progress: the first still runs
    assert answer is not None and answer[0] == 201
    booking = Booking.objects.get(owner=bob)
    assert f'"id": {booking.pk}'.encode() in answer[2]


@pytest.mark.services
def test_at_the_windows_edge(server: str, alice: User) -> None:
    body, headers = form(alice, "2026-07-30T12:00:00Z")
    assert servers.post(f"{server}{URL}", body, headers)[0] == 201
    time.sleep(1.5)
    inside = servers.post(f"{server}{URL}", body, headers)
    assert inside[1].get("Idempotency-Window") == "2"
    time.sleep(1.0)  # 2.5 s after the first: past the window
    outside = servers.post(f"{server}{URL}", body, headers)
    assert outside[0] == 201 and "Idempotency-Window" not in outside[1]
    assert Booking.objects.filter(slot__startswith="2026-07-30T12").count() == 2
