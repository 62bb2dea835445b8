"""Real concurrency: threads against the real database (SQLite file or PostgreSQL)."""

from __future__ import annotations

import json
import time

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import RequestInfo, StoredResponse
from tests.checkpoints import Checkpoint
from tests.concurrency import Background, in_threads, logged_in_client
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

BODY = json.dumps({"slot": "2026-07-30T09:00:00Z"})
RESPONSE = StoredResponse(status=201, headers=(("Content-Type", "application/json"),), body=b"{}")
OTHER_INFO = RequestInfo(method="POST", path="/plain/bookings/", fingerprint="e" * 64)
on_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs concurrent writers (PostgreSQL)"
)


def keyed_post(client: Client, url: str, key: str = "storm", body: str = BODY, pause_at: str = ""):  # type: ignore[no-untyped-def]
    """``pause_at``: the view waits at that checkpoint (a header: not part of the request's
    fingerprint, so the same request without it is a duplicate)."""
    headers = {"X-Pause-At": pause_at} if pause_at else {}
    return client.post(
        url, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key, headers=headers
    )


def reservation_exists() -> bool:
    return IdempotencyRecord.objects.filter(state=IdempotencyRecord.State.IN_PROGRESS).exists()


def assert_storm_outcome(responses: list, expected_bookings: int = 1) -> None:  # type: ignore[type-arg]
    errors = [r for r in responses if isinstance(r, BaseException)]
    assert not errors, errors
    statuses = [r.status_code for r in responses]
    assert all(status < 500 for status in statuses), statuses
    originals = [r for r in responses if r.status_code == 201 and "Idempotency-Replayed" not in r]
    assert len(originals) == 1
    for response in responses:
        if response.status_code == 409:
            assert response.json()["code"] == "idempotency_key_in_progress"
        else:
            assert response.status_code == 201
            assert response.content == originals[0].content
    assert Booking.objects.count() == expected_bookings


@pytest.mark.parametrize("url", ["/plain/bookings/?delay=0.2", "/api/bookings/?delay=0.2"])
def test_storm_of_identical_requests_runs_the_view_once(alice: User, url: str) -> None:
    clients = [logged_in_client(alice) for _ in range(12)]
    responses = in_threads(len(clients), lambda i: keyed_post(clients[i], url))
    assert_storm_outcome(responses)


@on_postgres
@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize("url", ["/plain/bookings/?delay=0.2", "/api/bookings/?delay=0.2"])
def test_storm_under_atomic_requests(alice: User, url: str) -> None:
    clients = [logged_in_client(alice) for _ in range(12)]
    responses = in_threads(len(clients), lambda i: keyed_post(clients[i], url))
    assert_storm_outcome(responses)


@on_postgres
@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize("url", ["/plain/bookings/", "/api/bookings/", "/plain/atomic/"])
def test_duplicate_gets_409_at_once_while_the_first_runs_in_a_transaction(
    alice: User, url: str
) -> None:
    with Checkpoint("running") as running:  # the first's view waits there until the block ends
        first = Background(
            lambda: keyed_post(logged_in_client(alice), url, pause_at="running")
        ).start()
        running.wait_until_reached()  # its key claimed, inside its transaction
        duplicate = keyed_post(logged_in_client(alice), url)
        # Answered while the first is still inside its transaction: no waiting on its locks.
        assert first.is_running()
    assert duplicate.status_code == 409
    assert duplicate.json()["code"] == "idempotency_key_in_progress"
    assert first.join().status_code == 201
    assert Booking.objects.count() == 1


@on_postgres
@pytest.mark.usefixtures("atomic_requests")
def test_work_is_invisible_until_it_commits_with_its_record(alice: User) -> None:
    with Checkpoint("running") as running:  # the view waits there until the block ends
        first = Background(
            lambda: keyed_post(logged_in_client(alice), "/plain/atomic/", pause_at="running")
        ).start()
        running.wait_until_reached()  # the view has made its booking, uncommitted
        # Neither the reservation nor the work is visible before they commit together.
        assert Booking.objects.count() == 0
        assert not reservation_exists()
    assert first.join().status_code == 201
    record = IdempotencyRecord.objects.get()
    assert record.state == IdempotencyRecord.State.COMPLETED
    assert Booking.objects.count() == 1


@pytest.mark.usefixtures("atomic_requests")
def test_rolled_back_transaction_releases_the_key(alice: User) -> None:
    client = logged_in_client(alice)
    client.raise_request_exception = False
    assert keyed_post(client, "/plain/bookings/?raise=1").status_code == 500
    assert keyed_post(client, "/api/bookings/?raise=1").status_code == 500
    assert Booking.objects.count() == 0  # the view's writes rolled back
    assert IdempotencyRecord.objects.count() == 0  # and the key is free again
    assert keyed_post(client, "/plain/bookings/").status_code == 201


def test_atomic_option_rolls_back_work_and_releases(alice: User) -> None:
    client = logged_in_client(alice)
    client.raise_request_exception = False
    assert keyed_post(client, "/plain/atomic/?raise=1").status_code == 500
    assert Booking.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0


@pytest.mark.usefixtures("atomic_requests")
def test_crash_after_storing_rolls_back_work_and_response_together(alice: User, settings) -> None:  # type: ignore[no-untyped-def]
    """Exactly once: the stored response commits with the work or not at all."""
    settings.IDEMPOTENCY = {"LOCK_TIMEOUT": 1}
    client = logged_in_client(alice)
    client.raise_request_exception = False
    assert keyed_post(client, "/plain/fragile/?crash=1", key="fragile").status_code == 500
    assert Booking.objects.count() == 0
    # No completed record survived the rollback, so nothing can replay a
    # response whose work never happened; the retry runs the work once.
    assert not IdempotencyRecord.objects.filter(state="completed").exists()
    if IdempotencyRecord.objects.exists():  # the reservation, left to expire
        time.sleep(1.1)
    retry = keyed_post(client, "/plain/fragile/", key="fragile")
    assert retry.status_code == 201
    assert keyed_post(client, "/plain/fragile/", key="fragile")["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1


@on_postgres
def test_replays_in_transactions_at_the_same_time_both_replay(alice: User) -> None:
    """Each claim inside a transaction takes the key's lock, a replay's too: a second
    replay meanwhile must still replay the committed record, not answer 409."""
    from django.db import transaction

    from idempotency_django.stores import Outcome, RecordKey, RequestInfo, get_store

    store = get_store()
    key = RecordKey(f"auth.user:{alice.pk}", "", "replayed-twice")
    info = RequestInfo(method="POST", path="/plain/bookings/", fingerprint="f" * 64)
    first = store.claim(key, info, 60)
    assert store.complete(key, first.token, RESPONSE, 3600)
    with transaction.atomic():
        assert store.claim(key, info, 60).outcome is Outcome.REPLAY  # holds the lock now
        [other] = in_threads(1, lambda _: _claim_in_a_transaction(store, key, info))
        [reused] = in_threads(1, lambda _: _claim_in_a_transaction(store, key, OTHER_INFO))
    assert other.outcome is Outcome.REPLAY
    assert other.response == RESPONSE
    assert reused.outcome is Outcome.REUSED


def _claim_in_a_transaction(store, key, info):  # type: ignore[no-untyped-def]
    from django.db import transaction

    with transaction.atomic():
        return store.claim(key, info, 60)
