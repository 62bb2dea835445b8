"""WAIT_FOR_IN_PROGRESS: a duplicate waits for the request it duplicates, then replays it.

The first request is held inside its view at a checkpoint; the duplicate runs
in another thread and says when it starts waiting (its ``waiting`` log line),
so nothing here depends on sleeping and hoping.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.db import connection
from django.test import AsyncClient, override_settings

from tests.checkpoints import Checkpoint
from tests.concurrency import Background, logged_in_client
from tests.redis_helpers import ALIAS, redis_store_settings
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

BODY = json.dumps({"slot": "2026-07-30T09:00:00Z"})
URL = "/plain/paused/?at=first"


def keyed_post(client, url: str = URL, key: str = "booking-8891"):  # type: ignore[no-untyped-def]
    return client.post(url, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


class Waiting(logging.Handler):
    """Set once a request logs that it waits for the key."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)  # "waiting" is a DEBUG record (issue 36)
        self.started = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "idempotency", {}).get("event") == "waiting":
            self.started.set()


@pytest.fixture
def waiting() -> Iterator[Waiting]:
    handler = Waiting()
    logger = logging.getLogger("idempotency_django")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[dict[str, object]]:
    if request.param == "redis":
        with redis_store_settings():
            yield {"STORE": "redis", "STORE_OPTIONS": {"cache": ALIAS}}
    else:
        yield {}


def test_a_duplicate_waits_and_replays_the_answer(
    alice: User, store: dict[str, object], waiting: Waiting
) -> None:
    with override_settings(IDEMPOTENCY={**store, "WAIT_FOR_IN_PROGRESS": 10}):
        with Checkpoint("first") as first_request:
            first = Background(lambda: keyed_post(logged_in_client(alice))).start()
            first_request.wait_until_reached()
            duplicate = Background(lambda: keyed_post(logged_in_client(alice))).start()
            assert waiting.started.wait(10), "the duplicate never waited"
            assert duplicate.is_running()
            first_request.release()
            assert first.join().status_code == 201
        answer = duplicate.join()
    assert answer.status_code == 201
    assert answer["Idempotency-Replayed"] == "true"
    assert answer.content == first.result.content
    assert Booking.objects.count() == 1


def test_past_the_wait_the_duplicate_gets_409(
    alice: User, store: dict[str, object], waiting: Waiting
) -> None:
    wait = override_settings(IDEMPOTENCY={**store, "WAIT_FOR_IN_PROGRESS": 0.3})
    with wait, Checkpoint("first") as first_request:
        first = Background(lambda: keyed_post(logged_in_client(alice))).start()
        first_request.wait_until_reached()
        started = time.monotonic()
        answer = keyed_post(logged_in_client(alice))
        waited = time.monotonic() - started
        first_request.release()
        first.join()
    assert answer.status_code == 409
    assert answer.json()["code"] == "idempotency_key_in_progress"
    assert answer["Retry-After"] == "1"
    assert waiting.started.is_set()
    assert waited >= 0.3  # it did wait its time before answering
    assert Booking.objects.count() == 1


def test_when_the_first_fails_the_waiting_duplicate_runs(
    alice: User, store: dict[str, object], waiting: Waiting
) -> None:
    """A 5xx releases the key: the duplicate that waited is the retry that runs."""
    failing = "/plain/paused/?at=first&status=503"
    with override_settings(IDEMPOTENCY={**store, "WAIT_FOR_IN_PROGRESS": 10}):
        with Checkpoint("first") as first_request:
            first = Background(lambda: keyed_post(logged_in_client(alice), failing)).start()
            first_request.wait_until_reached()
            duplicate = Background(lambda: keyed_post(logged_in_client(alice), failing)).start()
            assert waiting.started.wait(10)
            first_request.release()
            assert first.join().status_code == 503
        answer = duplicate.join()
    assert answer.status_code == 503  # it ran the view itself: not a replay, not a 409
    assert "Idempotency-Replayed" not in answer
    assert Booking.objects.count() == 2


@pytest.mark.usefixtures("atomic_requests")
def test_a_waiting_duplicate_holds_no_transaction(alice: User, waiting: Waiting) -> None:
    """Under ATOMIC_REQUESTS the first holds its transaction; the waiter holds none."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite's writer lock makes a duplicate wait in the claim itself")
    # Logged in before: on MariaDB a login's UPDATE of last_login would wait for the
    # first request's transaction, whose booking locks the user row (a foreign key).
    clients = [logged_in_client(alice), logged_in_client(alice)]
    with override_settings(IDEMPOTENCY={"WAIT_FOR_IN_PROGRESS": 10}):
        with Checkpoint("first") as first_request:
            first = Background(lambda: keyed_post(clients[0])).start()
            first_request.wait_until_reached()
            duplicate = Background(lambda: keyed_post(clients[1])).start()
            assert waiting.started.wait(10)
            in_transaction = sessions_in_a_transaction()
            first_request.release()
            assert first.join().status_code == 201
        assert duplicate.join()["Idempotency-Replayed"] == "true"
    assert in_transaction == {first_request.info["server_id"]}
    assert Booking.objects.count() == 1


def sessions_in_a_transaction() -> set[int]:
    """The server-side ids of the connections that hold an open transaction right now."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND state LIKE 'idle in transaction%%'"
            )
        else:
            # This database's sessions only: the server is shared with other runs.
            cursor.execute(
                "SELECT trx.trx_mysql_thread_id FROM information_schema.innodb_trx trx "
                "JOIN information_schema.processlist session "
                "ON session.id = trx.trx_mysql_thread_id WHERE session.db = DATABASE()"
            )
        return {int(row[0]) for row in cursor.fetchall()}


def test_an_async_duplicate_waits_without_blocking_the_event_loop(
    alice: User, waiting: Waiting
) -> None:
    client = AsyncClient()
    client.force_login(alice)

    async def scenario():  # type: ignore[no-untyped-def]
        async def book(pause_at: str = ""):  # type: ignore[no-untyped-def]
            headers = {"Idempotency-Key": "async-wait"}
            if pause_at:  # the view waits at that checkpoint (not part of the fingerprint)
                headers["X-Pause-At"] = pause_at
            return await client.post(
                "/async/bookings/", BODY, content_type="application/json", headers=headers
            )

        first = asyncio.ensure_future(book(pause_at="first"))
        await asyncio.to_thread(first_request.wait_until_reached)  # inside its view
        duplicate = asyncio.ensure_future(book())
        ticks = 0
        while not duplicate.done():  # the loop keeps turning while the duplicate waits
            ticks += 1
            if ticks >= 5 and waiting.started.is_set():
                first_request.release()
            await asyncio.sleep(0.05)
        return await first, await duplicate, ticks

    waits = override_settings(IDEMPOTENCY={"WAIT_FOR_IN_PROGRESS": 10})
    with waits, Checkpoint("first") as first_request:  # the first's view waits there
        first, duplicate, ticks = async_to_sync(scenario)()
    assert first.status_code == 201
    assert duplicate.status_code == 201 and duplicate["Idempotency-Replayed"] == "true"
    assert waiting.started.is_set()
    assert ticks >= 5
    assert Booking.objects.count() == 1
