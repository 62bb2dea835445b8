"""One contract, every store: the same tests run against the database and the Redis store.

Only three things differ per store and live in helpers below: how to make an
entry expire now, how to read its remaining lifetime, and how to make the
store unreachable.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import (
    BaseStore,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
    get_store,
)
from idempotency_django.stores.database import DatabaseStore
from idempotency_django.stores.redis import RedisStore
from tests.redis_helpers import DOWN_ALIAS, raw_client, redis_store_settings

KEY = RecordKey(principal="auth.user:1", location="", key="booking-1")
REQUEST = RequestInfo(method="POST", path="/plain/bookings/", fingerprint="f" * 64)
OTHER_REQUEST = RequestInfo(method="POST", path="/plain/bookings/", fingerprint="e" * 64)
LOCK_TIMEOUT = 300
RETENTION = 86400
#: Every byte value, newlines and NULs included: the body must come back untouched.
BODY = bytes(range(256)) + b'\n{"id": 1}\n\r\n\x00'
RESPONSE = StoredResponse(
    status=201,
    headers=(
        ("Content-Type", "application/json"),
        ("Location", "/plain/bookings/1/"),
        ("Link", '</terms>; rel="terms"; title="caf\u00e9"'),
        ("Vary", "Accept, Accept-Language"),
    ),
    body=BODY,
)


@pytest.fixture(params=[pytest.param("database", marks=pytest.mark.django_db), "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[BaseStore]:
    if request.param == "database":
        with override_settings(IDEMPOTENCY={"STORE": "database"}):
            yield get_store()
    else:
        with redis_store_settings():
            yield get_store()


# -- what differs per store ----------------------------------------------------


def expire_now(store: BaseStore, key: RecordKey = KEY) -> None:
    """Make the entry for ``key`` as old as its lock timeout or retention."""
    if isinstance(store, RedisStore):
        assert raw_client().pexpire(store.redis_key(key), 1)
        time.sleep(0.01)
    else:
        past = timezone.now() - timedelta(seconds=1)
        updated = IdempotencyRecord.objects.filter(
            principal=key.principal, location=key.location, key=key.key
        ).update(expires_at=past)
        assert updated == 1


def remaining_seconds(store: BaseStore, key: RecordKey = KEY) -> float:
    if isinstance(store, RedisStore):
        return float(raw_client().pttl(store.redis_key(key))) / 1000
    record = IdempotencyRecord.objects.get(
        principal=key.principal, location=key.location, key=key.key
    )
    return (record.expires_at - timezone.now()).total_seconds()


@contextlib.contextmanager
def unreachable(store: BaseStore) -> Iterator[BaseStore]:
    """The same kind of store, pointed at a server nobody listens on."""
    if isinstance(store, DatabaseStore):
        pytest.skip("database outages are covered by the engine tests, not simulated here")
    with override_settings(IDEMPOTENCY={"STORE": "redis", "STORE_OPTIONS": {"cache": DOWN_ALIAS}}):
        yield get_store()


# -- the contract ---------------------------------------------------------------


def test_flags(store: BaseStore) -> None:
    if isinstance(store, RedisStore):
        assert (store.database_alias, store.expires_by_itself) == (None, True)
    else:
        assert (store.database_alias, store.expires_by_itself) == ("default", False)


def test_a_free_key_is_claimed_with_a_fresh_token(store: BaseStore) -> None:
    first = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    other = store.claim(RecordKey(KEY.principal, "", "booking-2"), REQUEST, LOCK_TIMEOUT)
    assert first.outcome is Outcome.CLAIMED and other.outcome is Outcome.CLAIMED
    assert first.token and other.token and first.token != other.token
    assert first.response is None


def test_a_live_reservation_is_in_progress(store: BaseStore) -> None:
    store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    duplicate = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    assert duplicate.outcome is Outcome.IN_PROGRESS
    assert duplicate.token == "" and duplicate.response is None


def test_a_live_reservation_for_another_request_is_reused(store: BaseStore) -> None:
    store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    assert store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT).outcome is Outcome.REUSED


def test_a_completed_key_replays_byte_identical(store: BaseStore) -> None:
    claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    assert store.complete(KEY, claim.token, RESPONSE, RETENTION) is True
    replay = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    assert replay.outcome is Outcome.REPLAY
    assert replay.token == ""
    assert replay.response == RESPONSE
    assert replay.response is not None and replay.response.body == BODY


def test_an_empty_response_replays(store: BaseStore) -> None:
    empty = StoredResponse(status=204, headers=(), body=b"")
    claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    assert store.complete(KEY, claim.token, empty, RETENTION)
    assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).response == empty


def test_a_completed_key_for_another_request_is_reused(store: BaseStore) -> None:
    claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    store.complete(KEY, claim.token, RESPONSE, RETENTION)
    reused = store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT)
    assert reused.outcome is Outcome.REUSED
    assert reused.response is None


def test_scopes_never_share_an_entry(store: BaseStore) -> None:
    claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    store.complete(KEY, claim.token, RESPONSE, RETENTION)
    for other in (
        RecordKey("auth.user:2", KEY.location, KEY.key),
        RecordKey(KEY.principal, "portland", KEY.key),
        RecordKey(KEY.principal, KEY.location, "booking-1 "),
    ):
        assert store.claim(other, REQUEST, LOCK_TIMEOUT).outcome is Outcome.CLAIMED


def test_an_abandoned_reservation_is_taken_over_after_expiry(store: BaseStore) -> None:
    crashed = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    expire_now(store)
    takeover = store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT)
    assert takeover.outcome is Outcome.CLAIMED
    assert takeover.token != crashed.token
    # The new owner's reservation is live, with its own fingerprint.
    assert store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT).outcome is Outcome.IN_PROGRESS
    assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.REUSED


def test_the_lock_timeout_elapses_by_itself(store: BaseStore) -> None:
    store.claim(KEY, REQUEST, 1)
    assert store.claim(KEY, REQUEST, 1).outcome is Outcome.IN_PROGRESS
    time.sleep(1.1)
    assert store.claim(KEY, REQUEST, 1).outcome is Outcome.CLAIMED


def test_complete_after_takeover_returns_false(store: BaseStore) -> None:
    crashed = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    expire_now(store)
    takeover = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    assert store.complete(KEY, crashed.token, RESPONSE, RETENTION) is False
    # The late completion neither replaced nor ended the new reservation.
    assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.IN_PROGRESS
    mine = StoredResponse(status=200, headers=(), body=b"the new owner's answer")
    assert store.complete(KEY, takeover.token, mine, RETENTION) is True
    assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).response == mine


def test_release_after_takeover_keeps_the_new_owner(store: BaseStore) -> None:
    crashed = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    expire_now(store)
    store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    store.release(KEY, crashed.token)
    assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.IN_PROGRESS


def test_release_frees_the_key_for_a_retry(store: BaseStore) -> None:
    claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    store.release(KEY, claim.token)
    retry = store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT)
    assert retry.outcome is Outcome.CLAIMED
    assert retry.token != claim.token


def test_release_with_another_token_keeps_the_reservation(store: BaseStore) -> None:
    store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    store.release(KEY, "not-the-owner")
    assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.IN_PROGRESS


def test_release_never_drops_a_completed_response(store: BaseStore) -> None:
    claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    store.complete(KEY, claim.token, RESPONSE, RETENTION)
    store.release(KEY, claim.token)
    assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.REPLAY


def test_release_of_a_free_key_is_harmless(store: BaseStore) -> None:
    store.release(KEY, "nobody")
    assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.CLAIMED


def test_complete_after_release_does_not_resurrect(store: BaseStore) -> None:
    claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    store.release(KEY, claim.token)
    assert store.complete(KEY, claim.token, RESPONSE, RETENTION) is False
    assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.CLAIMED


def forget(store: BaseStore, key: RecordKey = KEY) -> None:
    """The entry is gone: Redis expired it, or a purge deleted the abandoned row."""
    if isinstance(store, RedisStore):
        raw_client().delete(store.redis_key(key))
    else:
        IdempotencyRecord.objects.filter(principal=key.principal, key=key.key).delete()


def test_a_request_that_outlived_its_lock_timeout_still_stores(store: BaseStore) -> None:
    slow = store.claim(KEY, REQUEST, 1)
    forget(store)  # its reservation is gone; nobody claimed the key since
    assert store.complete(KEY, slow.token, RESPONSE, RETENTION, request=REQUEST) is True
    replay = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    assert replay.outcome is Outcome.REPLAY and replay.response == RESPONSE
    assert store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT).outcome is Outcome.REUSED


def test_a_late_completion_never_overwrites_a_takeover(store: BaseStore) -> None:
    slow = store.claim(KEY, REQUEST, 1)
    expire_now(store)
    store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT)
    assert store.complete(KEY, slow.token, RESPONSE, RETENTION, request=REQUEST) is False
    assert store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT).outcome is Outcome.IN_PROGRESS


def test_complete_counts_once(store: BaseStore) -> None:
    claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    assert store.complete(KEY, claim.token, RESPONSE, RETENTION) is True
    second = StoredResponse(status=200, headers=(), body=b"second")
    assert store.complete(KEY, claim.token, second, RETENTION) is False
    assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).response == RESPONSE


def test_a_reservation_lasts_the_lock_timeout(store: BaseStore) -> None:
    store.claim(KEY, REQUEST, 120)
    assert 115 < remaining_seconds(store) <= 120


def test_a_completed_response_is_kept_for_the_retention(store: BaseStore) -> None:
    claim = store.claim(KEY, REQUEST, 120)
    store.complete(KEY, claim.token, RESPONSE, 7200)
    assert 7190 < remaining_seconds(store) <= 7200


def test_an_expired_response_counts_as_absent(store: BaseStore) -> None:
    claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    store.complete(KEY, claim.token, RESPONSE, RETENTION)
    expire_now(store)
    assert store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT).outcome is Outcome.CLAIMED


def test_peek_reports_without_claiming(store: BaseStore) -> None:
    assert store.peek(KEY) is None
    claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    assert store.peek(KEY) is Outcome.IN_PROGRESS
    store.complete(KEY, claim.token, RESPONSE, RETENTION)
    assert store.peek(KEY) is Outcome.REPLAY
    expire_now(store)
    assert store.peek(KEY) is None


def test_an_unreachable_store_raises_store_unavailable(store: BaseStore) -> None:
    with unreachable(store) as down:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as excinfo:
            down.claim(KEY, REQUEST, LOCK_TIMEOUT)
        assert time.monotonic() - started < 5
        assert excinfo.value.__cause__ is not None
        with pytest.raises(StoreUnavailable):
            down.complete(KEY, "token", RESPONSE, RETENTION)
        with pytest.raises(StoreUnavailable):
            down.release(KEY, "token")
        with pytest.raises(StoreUnavailable):
            down.peek(KEY)


def test_lookup_tells_state_status_and_expiry_never_the_body(store: BaseStore) -> None:
    assert store.lookup(KEY) is None
    claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    reserved = store.lookup(KEY)
    assert reserved is not None and (reserved.state, reserved.status) == ("in_progress", None)
    assert LOCK_TIMEOUT - 5 < reserved.expires_in <= LOCK_TIMEOUT
    store.complete(KEY, claim.token, RESPONSE, RETENTION)
    completed = store.lookup(KEY)
    assert completed is not None and (completed.state, completed.status) == ("completed", 201)
    assert RETENTION - 5 < completed.expires_in <= RETENTION
    assert not hasattr(completed, "body")
    expire_now(store)
    assert store.lookup(KEY) is None
