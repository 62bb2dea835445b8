"""A ``stored`` signal receiver that raises, with ``ATOMIC_REQUESTS``.

The receiver runs after the response was written into the request's open
transaction. Its error fails the request at once with that error; the work
and the record roll back together, and the key is free for a retry. Nothing
waits on a lock the request's own transaction holds.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections
from django.test import Client

from idempotency_django import signals
from idempotency_django.models import IdempotencyRecord
from tests.concurrency import Background, logged_in_client
from tests.testapp.models import Booking

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("atomic_requests", "bounded_lock_waits"),
]

BODY = json.dumps({"slot": "2026-07-30T09:00"})
URLS = [
    pytest.param("/plain/bookings/", id="middleware"),
    pytest.param("/api/bookings/", id="drf"),
    pytest.param("/plain/atomic/", id="idempotent-atomic"),
]
#: Seconds any lock wait may last: bounds a request that would wait on its own
#: transaction's lock (for ever, without it) so that such a test fails, not hangs.
LOCK_WAIT_GUARD = 10
LOCK_WAIT_OPTIONS = {
    "postgresql": {"options": f"-c lock_timeout={LOCK_WAIT_GUARD * 1000}"},
    "mysql": {"init_command": f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_GUARD}"},
    "sqlite": {"timeout": LOCK_WAIT_GUARD},
}


class ReceiverFailed(Exception):
    pass


@pytest.fixture
def bounded_lock_waits() -> Iterator[None]:
    """Every connection opened from now on gives up a lock wait after LOCK_WAIT_GUARD."""
    options = connections.settings["default"]["OPTIONS"]
    saved = dict(options)
    options.update(LOCK_WAIT_OPTIONS[connection.vendor])
    try:
        yield
    finally:
        options.clear()
        options.update(saved)


@contextlib.contextmanager
def failing_stored_receiver() -> Iterator[None]:
    def receiver(**kwargs: Any) -> None:
        raise ReceiverFailed("the metrics backend is down")

    signals.stored.connect(receiver, weak=False, dispatch_uid="real-stack-failing-receiver")
    try:
        yield
    finally:
        signals.stored.disconnect(dispatch_uid="real-stack-failing-receiver")


def keyed_post(client: Client, url: str, key: str):  # type: ignore[no-untyped-def]
    """In a thread of its own, on a connection opened with the lock wait guard."""
    request = Background(
        lambda: client.post(url, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)
    )
    return request.start().join()


@pytest.fixture
def client(alice: User) -> Client:
    client = logged_in_client(alice)
    client.raise_request_exception = False
    return client


@pytest.mark.parametrize("url", URLS)
def test_the_request_fails_with_the_receivers_error(client: Client, url: str) -> None:
    with failing_stored_receiver():
        response = keyed_post(client, url, "receiver-1")
    assert response.status_code == 500
    assert response.exc_info[0] is ReceiverFailed


@pytest.mark.parametrize("url", URLS)
def test_the_work_and_the_record_roll_back_together(client: Client, url: str) -> None:
    with failing_stored_receiver():
        keyed_post(client, url, "receiver-2")
    assert Booking.objects.count() == 0
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize("url", URLS)
def test_the_key_is_free_for_a_retry(client: Client, url: str) -> None:
    with failing_stored_receiver():
        keyed_post(client, url, "receiver-3")
    retry = keyed_post(client, url, "receiver-3")
    assert retry.status_code == 201
    assert "Idempotency-Replayed" not in retry
    assert Booking.objects.count() == 1
