"""The store contract as a pytest class: prove a store of your own against it.

Subclass ``StoreContract`` in a test module, give it a ``store`` fixture that builds
your store (empty), and the hooks it cannot guess: make an entry expire now, and read
an entry's remaining lifetime from the store's own clock. Every test of the class then
runs against your store, as it runs against the package's own stores in its suite.
Needs pytest and Django settings (pytest-django): nothing else in the package imports it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from idempotency_django.stores import (
    BaseStore,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
)

__all__ = ["BODY", "KEY", "OTHER_REQUEST", "REQUEST", "RESPONSE", "StoreContract"]

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


class StoreContract:
    """What every store must do, as pytest tests; subclass it with your store.

    Provide a ``store`` fixture (an empty store) and override ``expire_now`` and
    ``remaining_seconds``; override ``unreachable`` to run the outage test, and
    ``forget`` if your store has no ``clear()``.
    """

    @pytest.fixture
    def store(self) -> Iterator[BaseStore]:
        """Your store, empty; a subclass overrides this fixture."""
        raise NotImplementedError(f"{type(self).__name__} must define a 'store' fixture.")

    def expire_now(self, store: BaseStore, key: RecordKey) -> None:
        """Make the entry of ``key`` as old as its lock timeout or retention (not deleted)."""
        raise NotImplementedError(f"{type(self).__name__} must define expire_now().")

    def remaining_seconds(self, store: BaseStore, key: RecordKey) -> float:
        """Seconds until the entry of ``key`` expires, read from the store itself.

        Not through ``store.lookup()``: the contract tests that one against this.
        """
        raise NotImplementedError(f"{type(self).__name__} must define remaining_seconds().")

    def unreachable(self, store: BaseStore) -> BaseStore:
        """The same kind of store, pointed at a server nobody listens on.

        A store that cannot simulate an outage leaves this as it is: the outage
        test is then skipped, with this reason.
        """
        pytest.skip(f"{type(self).__name__} does not simulate an outage (no unreachable())")

    def forget(self, store: BaseStore, key: RecordKey) -> None:
        """Make the entry of ``key`` gone, as a purge or an expiry in Redis would.

        The tests that call it hold ``key`` alone, so ``clear()`` does.
        """
        store.clear()

    def test_a_free_key_is_claimed_with_a_fresh_token(self, store: BaseStore) -> None:
        first = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        other = store.claim(RecordKey(KEY.principal, "", "booking-2"), REQUEST, LOCK_TIMEOUT)
        assert first.outcome is Outcome.CLAIMED and other.outcome is Outcome.CLAIMED
        assert first.token and other.token and first.token != other.token
        assert first.response is None

    def test_a_live_reservation_is_in_progress(self, store: BaseStore) -> None:
        store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        duplicate = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        assert duplicate.outcome is Outcome.IN_PROGRESS
        assert duplicate.token == "" and duplicate.response is None

    def test_a_live_reservation_for_another_request_is_reused(self, store: BaseStore) -> None:
        store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        assert store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT).outcome is Outcome.REUSED

    def test_a_completed_key_replays_byte_identical(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        assert store.complete(KEY, claim.token, RESPONSE, RETENTION) is True
        replay = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        assert replay.outcome is Outcome.REPLAY
        assert replay.token == ""
        assert replay.response == RESPONSE
        assert replay.response.body == BODY

    def test_an_empty_response_replays(self, store: BaseStore) -> None:
        empty = StoredResponse(status=204, headers=(), body=b"")
        claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        assert store.complete(KEY, claim.token, empty, RETENTION)
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).response == empty

    def test_a_completed_key_for_another_request_is_reused(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.complete(KEY, claim.token, RESPONSE, RETENTION)
        reused = store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT)
        assert reused.outcome is Outcome.REUSED
        assert reused.response is None

    def test_scopes_never_share_an_entry(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.complete(KEY, claim.token, RESPONSE, RETENTION)
        for other in (
            RecordKey("auth.user:2", KEY.location, KEY.key),
            RecordKey(KEY.principal, "portland", KEY.key),
            RecordKey(KEY.principal, KEY.location, "booking-1 "),
        ):
            assert store.claim(other, REQUEST, LOCK_TIMEOUT).outcome is Outcome.CLAIMED

    def test_an_abandoned_reservation_is_taken_over_after_expiry(self, store: BaseStore) -> None:
        crashed = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        self.expire_now(store, KEY)
        takeover = store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT)
        assert takeover.outcome is Outcome.CLAIMED
        assert takeover.token != crashed.token
        # The new owner's reservation is live, with its own fingerprint.
        assert store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT).outcome is Outcome.IN_PROGRESS
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.REUSED

    def test_the_lock_timeout_elapses_by_itself(self, store: BaseStore) -> None:
        store.claim(KEY, REQUEST, 1)
        assert store.claim(KEY, REQUEST, 1).outcome is Outcome.IN_PROGRESS
        time.sleep(1.1)
        assert store.claim(KEY, REQUEST, 1).outcome is Outcome.CLAIMED

    def test_complete_after_takeover_returns_false(self, store: BaseStore) -> None:
        crashed = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        self.expire_now(store, KEY)
        takeover = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        assert store.complete(KEY, crashed.token, RESPONSE, RETENTION) is False
        # The late completion neither replaced nor ended the new reservation.
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.IN_PROGRESS
        mine = StoredResponse(status=200, headers=(), body=b"the new owner's answer")
        assert store.complete(KEY, takeover.token, mine, RETENTION) is True
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).response == mine

    def test_release_after_takeover_keeps_the_new_owner(self, store: BaseStore) -> None:
        crashed = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        self.expire_now(store, KEY)
        store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.release(KEY, crashed.token)
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.IN_PROGRESS

    def test_release_frees_the_key_for_a_retry(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.release(KEY, claim.token)
        retry = store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT)
        assert retry.outcome is Outcome.CLAIMED
        assert retry.token != claim.token

    def test_release_with_another_token_keeps_the_reservation(self, store: BaseStore) -> None:
        store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.release(KEY, "not-the-owner")
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.IN_PROGRESS

    def test_release_never_drops_a_completed_response(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.complete(KEY, claim.token, RESPONSE, RETENTION)
        store.release(KEY, claim.token)
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.REPLAY

    def test_release_of_a_free_key_is_harmless(self, store: BaseStore) -> None:
        store.release(KEY, "nobody")
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.CLAIMED

    def test_complete_after_release_does_not_resurrect(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.release(KEY, claim.token)
        assert store.complete(KEY, claim.token, RESPONSE, RETENTION) is False
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.CLAIMED

    def test_renew_extends_the_reservation_it_owns(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, 60)
        assert store.renew(KEY, claim.token, 120, REQUEST) is True
        assert 115 < self.remaining_seconds(store, KEY) <= 120
        assert store.renew(KEY, "not-the-owner", 120, REQUEST) is False

    def test_renew_remakes_a_lost_reservation_unless_told_not_to(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, 1)
        self.forget(store, KEY)  # gone, and nobody claimed the key since
        assert store.renew(KEY, claim.token, LOCK_TIMEOUT, REQUEST, remake=False) is False
        assert store.peek(KEY) is None
        assert store.renew(KEY, claim.token, LOCK_TIMEOUT, REQUEST) is True
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.IN_PROGRESS

    def test_a_heartbeat_renewal_brings_no_settled_key_back(self, store: BaseStore) -> None:
        """remake=False (the heartbeat) after a release or a completion changes nothing."""
        released = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.release(KEY, released.token)
        assert store.renew(KEY, released.token, LOCK_TIMEOUT, REQUEST, remake=False) is False
        assert store.peek(KEY) is None
        completed = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.complete(KEY, completed.token, RESPONSE, RETENTION)
        assert store.renew(KEY, completed.token, LOCK_TIMEOUT, REQUEST, remake=False) is False
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).response == RESPONSE

    def test_a_request_that_outlived_its_lock_timeout_still_stores(self, store: BaseStore) -> None:
        slow = store.claim(KEY, REQUEST, 1)
        self.forget(store, KEY)  # its reservation is gone; nobody claimed the key since
        assert store.complete(KEY, slow.token, RESPONSE, RETENTION, request=REQUEST) is True
        replay = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        assert replay.outcome is Outcome.REPLAY and replay.response == RESPONSE
        assert store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT).outcome is Outcome.REUSED

    def test_a_late_completion_never_overwrites_a_takeover(self, store: BaseStore) -> None:
        slow = store.claim(KEY, REQUEST, 1)
        self.expire_now(store, KEY)
        store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT)
        assert store.complete(KEY, slow.token, RESPONSE, RETENTION, request=REQUEST) is False
        assert store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT).outcome is Outcome.IN_PROGRESS

    def test_complete_counts_once(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        assert store.complete(KEY, claim.token, RESPONSE, RETENTION) is True
        second = StoredResponse(status=200, headers=(), body=b"second")
        assert store.complete(KEY, claim.token, second, RETENTION) is False
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).response == RESPONSE

    def test_a_reservation_lasts_the_lock_timeout(self, store: BaseStore) -> None:
        store.claim(KEY, REQUEST, 120)
        assert 115 < self.remaining_seconds(store, KEY) <= 120

    def test_a_completed_response_is_kept_for_the_retention(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, 120)
        store.complete(KEY, claim.token, RESPONSE, 7200)
        assert 7190 < self.remaining_seconds(store, KEY) <= 7200

    def test_an_expired_response_counts_as_absent(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.complete(KEY, claim.token, RESPONSE, RETENTION)
        self.expire_now(store, KEY)
        assert store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT).outcome is Outcome.CLAIMED

    def test_peek_reports_without_claiming(self, store: BaseStore) -> None:
        assert store.peek(KEY) is None
        claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        assert store.peek(KEY) is Outcome.IN_PROGRESS
        store.complete(KEY, claim.token, RESPONSE, RETENTION)
        assert store.peek(KEY) is Outcome.REPLAY
        self.expire_now(store, KEY)
        assert store.peek(KEY) is None

    def test_an_unreachable_store_raises_store_unavailable(self, store: BaseStore) -> None:
        down = self.unreachable(store)
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

    def test_lookup_tells_state_status_and_expiry_never_the_body(self, store: BaseStore) -> None:
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
        self.expire_now(store, KEY)
        assert store.lookup(KEY) is None

    def test_clear_empties_the_store(self, store: BaseStore) -> None:
        claim = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.complete(KEY, claim.token, RESPONSE, RETENTION)
        other = RecordKey("auth.user:2", "", "booking-2")
        store.claim(other, REQUEST, LOCK_TIMEOUT)
        store.clear()
        assert store.peek(KEY) is None and store.peek(other) is None
        assert store.claim(KEY, OTHER_REQUEST, LOCK_TIMEOUT).outcome is Outcome.CLAIMED

    def test_count_keys_counts_the_principal_s_live_keys(self, store: BaseStore) -> None:
        if not store.counts_keys:
            pytest.skip(f"{type(store).__name__} does not count keys (counts_keys is False)")
        store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        assert store.count_keys(KEY, LOCK_TIMEOUT) == (1, None)
        store.claim(RecordKey("auth.user:2", "", "theirs"), REQUEST, LOCK_TIMEOUT)
        second = RecordKey(KEY.principal, "", "booking-2")
        store.claim(second, REQUEST, 120)
        count, first_expiry = store.count_keys(second, 120)
        assert count == 2
        assert first_expiry is not None and LOCK_TIMEOUT - 5 < first_expiry <= LOCK_TIMEOUT
