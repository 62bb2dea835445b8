"""Concurrent writers on every database: SQLite, PostgreSQL and MariaDB.

Real threads, each with its own client and database connection. Where a test
needs one request to be inside its view while another arrives, a gate holds
the first there (after its claim, before its commit) until the test opens it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections
from django.test import Client

from idempotency_django.models import IdempotencyRecord
from tests.concurrency import Background, in_threads, logged_in_client
from tests.real_stack.views import Gate, new_gate
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

BODY = json.dumps({"slot": "2026-07-30T09:00"})
needs_concurrent_writers = pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has a single writer: a request in a transaction makes the others wait",
)
#: The same gated work through the middleware, DRF and ``@idempotent(atomic=True)``.
GATED_VIEWS = [
    pytest.param("/real/gated/", id="middleware"),
    pytest.param("/real/gated-api/", id="drf"),
    pytest.param("/real/gated-atomic/", id="idempotent-atomic"),
]


@pytest.fixture
def gate() -> Iterator[Gate]:
    gate = new_gate(uuid.uuid4().hex)
    yield gate
    gate.open()  # never leave a request waiting behind a failed test


def keyed_post(client: Client, url: str, key: str = "storm"):  # type: ignore[no-untyped-def]
    return client.post(url, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


def assert_one_run(responses: list[Any]) -> None:
    """One 201 from the view; every other answer is its replay or 409 in progress."""
    errors = [r for r in responses if isinstance(r, BaseException)]
    assert not errors, errors
    statuses = [r.status_code for r in responses]
    originals = [r for r in responses if r.status_code == 201 and "Idempotency-Replayed" not in r]
    assert len(originals) == 1, statuses
    for response in responses:
        if response.status_code == 409:
            assert response.json()["code"] == "idempotency_key_in_progress"
        else:
            assert response.status_code == 201, statuses
            assert response.content == originals[0].content
    assert Booking.objects.count() == 1


# -- a storm of identical requests -----------------------------------------------------


@pytest.mark.parametrize("url", ["/plain/bookings/?delay=0.2", "/api/bookings/?delay=0.2"])
def test_storm_of_identical_requests_runs_the_view_once(alice: User, url: str) -> None:
    clients = [logged_in_client(alice) for _ in range(12)]
    assert_one_run(in_threads(len(clients), lambda i: keyed_post(clients[i], url)))


@needs_concurrent_writers
@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize(
    "url", ["/plain/bookings/?delay=0.2", "/api/bookings/?delay=0.2", "/plain/atomic/?delay=0.2"]
)
def test_storm_under_atomic_requests_runs_the_view_once(alice: User, url: str) -> None:
    clients = [logged_in_client(alice) for _ in range(12)]
    assert_one_run(in_threads(len(clients), lambda i: keyed_post(clients[i], url)))


@pytest.fixture
def immediate_transactions() -> Iterator[None]:
    """SQLite's ``BEGIN IMMEDIATE`` for the connections opened from now on (Django 5.1+)."""
    options = connections.settings["default"]["OPTIONS"]
    options["transaction_mode"] = "IMMEDIATE"
    try:
        yield
    finally:
        del options["transaction_mode"]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's transaction_mode option")
@pytest.mark.usefixtures("atomic_requests", "immediate_transactions")
@pytest.mark.parametrize("url", ["/plain/bookings/?delay=0.2", "/api/bookings/?delay=0.2"])
def test_storm_under_atomic_requests_on_sqlite_waits_for_the_writer_then_replays(
    alice: User, url: str
) -> None:
    clients = [logged_in_client(alice) for _ in range(12)]
    responses = in_threads(len(clients), lambda i: keyed_post(clients[i], url))
    assert_one_run(responses)
    assert [r.status_code for r in responses] == [201] * 12


# -- a duplicate while the first is inside its view ---------------------------------------


def duplicate_while_first_is_inside(alice: User, url: str, gate: Gate) -> tuple[Any, Any]:
    """The first request's answer and its duplicate's, sent while the first was held."""
    url = f"{url}{gate.name}/"
    # Both log in before: on MariaDB a login's UPDATE of the user waits for the
    # first request's transaction, whose booking row references that user.
    first_client, duplicate_client = logged_in_client(alice), logged_in_client(alice)
    first = Background(lambda: keyed_post(first_client, url)).start()
    gate.wait_until_entered()
    duplicate = keyed_post(duplicate_client, url)
    gate.open()
    return first.join(), duplicate


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("/real/gated/", id="middleware"),
        pytest.param("/real/gated-api/", id="drf"),
        pytest.param("/real/gated-atomic/", id="idempotent-atomic", marks=needs_concurrent_writers),
    ],
)
def test_duplicate_gets_409_in_progress_while_the_first_runs(
    alice: User, url: str, gate: Gate
) -> None:
    first, duplicate = duplicate_while_first_is_inside(alice, url, gate)
    assert duplicate.status_code == 409
    assert duplicate.json()["code"] == "idempotency_key_in_progress"
    assert first.status_code == 201
    assert Booking.objects.count() == 1


@needs_concurrent_writers
@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize("url", GATED_VIEWS)
def test_duplicate_gets_409_in_progress_while_the_first_holds_its_transaction(
    alice: User, url: str, gate: Gate
) -> None:
    first, duplicate = duplicate_while_first_is_inside(alice, url, gate)
    assert duplicate.status_code == 409
    assert duplicate.json()["code"] == "idempotency_key_in_progress"
    assert first.status_code == 201
    assert Booking.objects.count() == 1


@needs_concurrent_writers
@pytest.mark.usefixtures("atomic_requests")
def test_work_and_its_record_are_invisible_until_they_commit_together(
    alice: User, gate: Gate
) -> None:
    url = f"/real/gated/{gate.name}/"
    client = logged_in_client(alice)
    first = Background(lambda: keyed_post(client, url)).start()
    gate.wait_until_entered()
    assert Booking.objects.count() == 0
    assert not IdempotencyRecord.objects.exists()
    gate.open()
    assert first.join().status_code == 201
    assert IdempotencyRecord.objects.get().state == IdempotencyRecord.State.COMPLETED
    assert Booking.objects.count() == 1
