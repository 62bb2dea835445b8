"""A store outside the view's transaction: the reservation is checked before the work commits.

With the Redis store (or a database store on another database) the stored
response cannot commit with the view's writes. So, just before the view's
transaction commits, the reservation is renewed; a request that lost it
(taken over after ``LOCK_TIMEOUT``) rolls its work back, and the response
is stored only once the work has committed.
"""

from __future__ import annotations

import json
import logging

import pytest
from django.contrib.auth.models import User

from idempotency_django.stores import Outcome, RecordKey, RequestInfo, get_store
from tests.checkpoints import Checkpoint
from tests.concurrency import Background, logged_in_client
from tests.redis_helpers import (
    caches_with,
    private_redis_server,
    raw_client,
    redis_cache,
    redis_store_settings,
    stored_entries,
)
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/plain/paused/?at=running"
BODY = json.dumps({"slot": "2026-07-30T09:00:00Z"})


def keyed_post(client, key: str = "booking-8891"):  # type: ignore[no-untyped-def]
    return client.post(URL, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.usefixtures("atomic_requests")
def test_the_response_is_stored_once_the_work_committed(alice: User) -> None:
    with redis_store_settings():
        with Checkpoint("running") as running:
            first = Background(lambda: keyed_post(logged_in_client(alice))).start()
            running.wait_until_reached()
            # The work is not committed yet, and neither is its answer stored.
            assert Booking.objects.count() == 0
            [reservation] = stored_entries().values()
            assert b'"state":"in_progress"' in reservation
            running.release()
            assert first.join().status_code == 201
        assert Booking.objects.count() == 1
        replay = keyed_post(logged_in_client(alice))
        assert replay["Idempotency-Replayed"] == "true"
        assert replay.content == first.result.content


@pytest.mark.usefixtures("atomic_requests")
def test_a_request_that_lost_its_reservation_rolls_its_work_back(
    alice: User, caplog: pytest.LogCaptureFixture
) -> None:
    """Its reservation expired and a retry took the key over: the slow one must not commit."""
    with redis_store_settings():
        store = get_store()
        with Checkpoint("running") as running:
            slow = Background(lambda: keyed_post(logged_in_client(alice))).start()
            running.wait_until_reached()
            [entry] = stored_entries()
            raw_client().delete(entry)  # its LOCK_TIMEOUT ran out
            takeover = store.claim(
                RecordKey(f"auth.user:{alice.pk}", "", "booking-8891"),
                RequestInfo("POST", URL, "retry's fingerprint"),
                300,
            )
            assert takeover.outcome is Outcome.CLAIMED
            with caplog.at_level(logging.WARNING, logger="idempotency_django"):
                running.release()
                answer = slow.join()
    assert answer.status_code == 409
    assert answer.json()["code"] == "idempotency_key_in_progress"
    assert Booking.objects.count() == 0  # rolled back: the retry that owns the key runs it
    assert "event=lost_reservation" in caplog.text


@pytest.mark.usefixtures("atomic_requests")
def test_a_store_that_fails_before_the_commit_rolls_the_work_back(alice: User) -> None:
    """The reservation cannot be confirmed: nothing commits, and the retry runs it once."""
    with private_redis_server() as (process, port):
        caches = caches_with(private=redis_cache(f"redis://127.0.0.1:{port}/0"))
        with redis_store_settings(alias="private", caches=caches), Checkpoint("running") as running:
            first = Background(lambda: keyed_post(logged_in_client(alice))).start()
            running.wait_until_reached()
            process.terminate()
            process.wait(timeout=5)
            running.release()
            answer = first.join()
    assert answer.status_code == 503
    assert answer.json()["code"] == "idempotency_unavailable"
    assert Booking.objects.count() == 0


def test_a_release_the_store_cannot_make_is_logged(
    alice: User, caplog: pytest.LogCaptureFixture
) -> None:
    """The view failed (5xx) and the store is down: the key stays reserved until it expires."""
    with private_redis_server() as (process, port):
        caches = caches_with(private=redis_cache(f"redis://127.0.0.1:{port}/0"))
        with redis_store_settings(alias="private", caches=caches):
            client = logged_in_client(alice)
            client.raise_request_exception = False
            with Checkpoint("running") as running, caplog.at_level(logging.ERROR):
                first = Background(
                    lambda: client.post(
                        "/plain/paused/?at=running&status=500",
                        BODY,
                        content_type="application/json",
                        HTTP_IDEMPOTENCY_KEY="k",
                    )
                ).start()
                running.wait_until_reached()
                process.terminate()
                process.wait(timeout=5)
                running.release()
                assert first.join().status_code == 500
    assert "event=release_failed" in caplog.text
