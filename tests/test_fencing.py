"""Who owns a key, decided by the store's clock and the store's compare-and-set.

Each test forces its interleaving with a checkpoint in the view (a request
paused at a chosen point while the test acts), never by sleeping and hoping.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
import time_machine
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client, override_settings
from django.utils import timezone

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import Outcome, RecordKey, RequestInfo, StoreUnavailable, database
from idempotency_django.stores.base import in_request_transaction
from idempotency_django.stores.database import DatabaseStore
from tests.checkpoints import Checkpoint, before_takeover
from tests.concurrency import Background, in_threads, logged_in_client
from tests.redis_helpers import redis_store_settings
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

BODY = json.dumps({"slot": "2026-07-30T09:00:00Z"})


def keyed_post(client: Client, url: str, key: str = "booking-8891"):  # type: ignore[no-untyped-def]
    return client.post(url, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "redis":
        with redis_store_settings():
            yield request.param
    else:
        yield request.param


def test_a_fast_app_server_clock_never_takes_over_a_running_request(
    alice: User, store: str
) -> None:
    """A server whose clock runs 301 s fast sees the reservation as the store does: live."""
    with Checkpoint("running") as running:
        first = Background(
            lambda: keyed_post(logged_in_client(alice), "/plain/paused/?at=running")
        ).start()
        running.wait_until_reached()
        fast = timezone.now() + timedelta(seconds=301)
        with time_machine.travel(fast, tick=True):
            duplicate = keyed_post(logged_in_client(alice), "/plain/paused/?at=running")
            call_command("purge_idempotency_records", verbosity=0)
        running.release()
        assert first.join().status_code == 201
    assert duplicate.status_code == 409
    assert duplicate.json()["code"] == "idempotency_key_in_progress"
    assert Booking.objects.count() == 1
    replay = keyed_post(logged_in_client(alice), "/plain/paused/?at=running")
    assert replay["Idempotency-Replayed"] == "true"


@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "atomic"])
def test_a_retry_that_loses_the_takeover_race_replays_the_original(
    alice: User, atomic: bool
) -> None:
    """The slow original completes between the retry's read and its takeover UPDATE.

    The takeover compares token, state and expiry, so it fails; the retry then
    finds the completed response and replays it. The view ran once. In a transaction
    (``ATOMIC``) PostgreSQL's retry holds the key's advisory lock by then, which the
    original, claimed outside one, never asked for: its completion commits, and the
    retry's failed takeover goes back to the claim's loop, which reads the answer.
    """
    if atomic and connection.vendor != "postgresql":
        # SQLite's write lock and MariaDB's locking read would make the original's
        # completion wait for the retry's transaction, which waits for it.
        pytest.skip("a retry in a transaction lets the original complete on PostgreSQL only")
    idempotency = {**getattr(settings, "IDEMPOTENCY", {}), "ATOMIC": atomic}
    with Checkpoint("slow") as slow:
        original = Background(
            lambda: keyed_post(logged_in_client(alice), "/plain/paused/?at=slow")
        ).start()
        slow.wait_until_reached()
        # Past LOCK_TIMEOUT by the database's clock: abandoned, as far as anyone can tell.
        abandoned = timezone.now() - timedelta(hours=1)
        assert IdempotencyRecord.objects.update(expires_at=abandoned) == 1

        def the_original_completes() -> None:
            # The retry's takeover runs in this thread: in its transaction, or in none.
            assert in_request_transaction(connection) is atomic
            slow.release()
            assert original.join().status_code == 201

        with before_takeover(the_original_completes), override_settings(IDEMPOTENCY=idempotency):
            retry = keyed_post(logged_in_client(alice), "/plain/paused/?at=slow")

    assert retry.status_code == 201
    assert retry["Idempotency-Replayed"] == "true"
    assert json.loads(retry.content) == json.loads(original.result.content)
    assert Booking.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert record.state == IdempotencyRecord.State.COMPLETED
    assert record.expires_at > timezone.now() + timedelta(hours=23)


@contextlib.contextmanager
def connection_lost(checkpoint: Checkpoint) -> Iterator[None]:
    """The request's database connection fails between its work and the completion.

    PostgreSQL and MariaDB: the server ends the request's session. SQLite: the
    records table stays write-locked until the request's wait for it runs out.
    """
    table = connection.ops.quote_name(IdempotencyRecord._meta.db_table)
    server_id = checkpoint.info["server_id"]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [server_id])
        yield
    elif connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(f"KILL CONNECTION {int(server_id)}")
        yield
    else:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"UPDATE {table} SET token = token")
            yield


def test_a_completion_that_fails_after_the_work_committed_never_frees_the_key(
    alice: User,
) -> None:
    """The booking committed; storing its answer failed. A retry must not book again."""
    with Checkpoint("booked") as booked:
        first = Background(
            lambda: keyed_post(logged_in_client(alice), "/plain/paused/?at=booked")
        ).start()
        booked.wait_until_reached()
        with connection_lost(booked):
            booked.release()
            first.join()
    assert Booking.objects.count() == 1
    retry = keyed_post(logged_in_client(alice), "/plain/paused/?at=booked")
    assert retry.status_code == 409
    assert retry.json()["code"] == "idempotency_key_in_progress"
    assert Booking.objects.count() == 1
    assert IdempotencyRecord.objects.get().state == IdempotencyRecord.State.IN_PROGRESS


@pytest.mark.usefixtures("atomic_requests")
def test_under_atomic_requests_a_failed_completion_rolls_the_work_back(alice: User) -> None:
    """The work and its record commit together or not at all: the retry books once."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite's single writer: the request holds the only write lock")
    with Checkpoint("booked") as booked:
        first = Background(
            lambda: keyed_post(logged_in_client(alice), "/plain/paused/?at=booked")
        ).start()
        booked.wait_until_reached()
        with connection_lost(booked):
            booked.release()
            first.join()
    assert Booking.objects.count() == 0
    assert not IdempotencyRecord.objects.exists()
    retry = keyed_post(logged_in_client(alice), "/plain/paused/?at=booked")
    assert retry.status_code == 201
    assert Booking.objects.count() == 1


def test_two_takeovers_of_one_expired_key_in_transactions_never_both_claim() -> None:
    """Two retries of a key whose reservation expired, each in its transaction, read the
    row before either takes it over. One claims; the other is told the key is in progress
    (PostgreSQL: the advisory lock) or that the store could not decide (MariaDB: InnoDB
    breaks the two share locks' deadlock, rolling the loser's transaction back; a 503 the
    client retries). Never two claims, never a wait for the winner's whole transaction."""
    store = DatabaseStore()
    key = RecordKey("auth.user:7", "", "abandoned-then-retried-twice")
    request = RequestInfo(method="POST", path="/bookings/", fingerprint="f" * 64)
    assert store.claim(key, request, 300).outcome is Outcome.CLAIMED
    abandoned = timezone.now() - timedelta(hours=1)
    assert IdempotencyRecord.objects.update(expires_at=abandoned) == 1

    both_read = threading.Barrier(2, timeout=3)  # PostgreSQL's loser never gets this far
    take_over = database._take_over

    def take_over_once_both_read(*args: Any, **kwargs: Any) -> bool:
        with contextlib.suppress(threading.BrokenBarrierError):
            both_read.wait()
        return take_over(*args, **kwargs)

    def retry(_index: int) -> str:
        try:
            with transaction.atomic():
                return store.claim(key, request, 300).outcome.value
        except StoreUnavailable:
            return "unavailable"

    with mock.patch.object(database, "_take_over", take_over_once_both_read):
        outcomes = sorted(in_threads(2, retry))
    assert outcomes[0] == "claimed", outcomes
    assert outcomes[1] in {"in_progress", "unavailable"}, outcomes
    assert IdempotencyRecord.objects.get().expires_at > timezone.now()
