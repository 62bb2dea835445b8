"""The in-memory store: the exported contract, its lock, its bound, and its check."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator

import pytest
from django.test import override_settings

from idempotency_django.checks import check_settings
from idempotency_django.protocol.fingerprint import keyed_digest
from idempotency_django.stores import BaseStore, Outcome, RecordKey, RequestInfo, get_store
from idempotency_django.stores.contract import KEY, LOCK_TIMEOUT, REQUEST, RESPONSE, StoreContract
from idempotency_django.stores.memory import MemoryStore


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> Iterator[BaseStore]:
        with override_settings(IDEMPOTENCY={"STORE": "memory"}):
            yield get_store()

    def expire_now(self, store: BaseStore, key: RecordKey) -> None:
        assert isinstance(store, MemoryStore)
        store._entries[key].expires_at = store.now()

    def remaining_seconds(self, store: BaseStore, key: RecordKey) -> float:
        assert isinstance(store, MemoryStore)
        return store._entries[key].expires_at - store.now()

    def test_flags(self, store: BaseStore) -> None:
        assert isinstance(store, MemoryStore)
        assert (store.database_alias, store.expires_by_itself, store.counts_keys) == (
            None,
            False,
            True,
        )


def test_one_of_many_threads_claims_a_key() -> None:
    store = MemoryStore()
    start = threading.Barrier(16)
    outcomes: list[Outcome] = []

    def claim() -> None:
        start.wait()
        outcomes.append(store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome)

    threads = [threading.Thread(target=claim) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(o.value for o in outcomes) == ["claimed"] + ["in_progress"] * 15


def test_max_entries_evicts_the_oldest_written() -> None:
    store = MemoryStore(max_entries=2)
    keys = [RecordKey("auth.user:1", "", f"k{n}") for n in range(3)]
    first = store.claim(keys[0], REQUEST, LOCK_TIMEOUT)
    store.claim(keys[1], REQUEST, LOCK_TIMEOUT)
    # Completing the first writes it again: the second is now the oldest.
    assert store.complete(keys[0], first.token, RESPONSE, LOCK_TIMEOUT)
    store.claim(keys[2], REQUEST, LOCK_TIMEOUT)
    assert [store.peek(k) for k in keys] == [Outcome.REPLAY, None, Outcome.IN_PROGRESS]


def test_an_abandoned_reservation_taken_over_says_so() -> None:
    store = MemoryStore()
    store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    store._entries[KEY].expires_at = store.now()
    assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).took_over is True


def test_renew_keeps_the_reservation_and_refuses_after_a_takeover() -> None:
    store = MemoryStore()
    mine = store.claim(KEY, REQUEST, 1)
    assert store.renew(KEY, mine.token, LOCK_TIMEOUT, REQUEST) is True
    assert store._entries[KEY].expires_at - store.now() > LOCK_TIMEOUT - 5
    store._entries[KEY].expires_at = store.now()
    store.claim(KEY, REQUEST, LOCK_TIMEOUT)
    assert store.renew(KEY, mine.token, LOCK_TIMEOUT, REQUEST) is False


def test_it_keeps_a_fingerprint_s_digest_and_not_the_body_it_was_made_of() -> None:
    """A fingerprint knows its parts (for the digests under fallback keys): the
    entry, which outlives the request, keeps the digest alone."""
    store = MemoryStore()
    body = b'{"card": "4242 4242 4242 4242"}'
    request = RequestInfo("POST", "/pay/", keyed_digest((b"POST\n/pay/\n", body)))
    mine = store.claim(KEY, request, LOCK_TIMEOUT)
    assert type(store._entries[KEY].fingerprint) is str
    del store._entries[KEY]  # expired and swept: the renewal makes it again
    assert store.renew(KEY, mine.token, LOCK_TIMEOUT, request) is True
    assert type(store._entries[KEY].fingerprint) is str
    assert store._entries[KEY].fingerprint == request.fingerprint
    assert body not in gc.get_referents(*gc.get_referents(store._entries[KEY]))


def memory_store_errors() -> list[str]:
    with override_settings(IDEMPOTENCY={"STORE": "memory"}):
        return [m.id for m in check_settings() if m.id == "idempotency_django.E023"]


@pytest.mark.parametrize(
    ("debug", "pytest_loaded", "argv", "refused"),
    [
        (False, True, ["pytest"], False),
        (False, False, ["manage.py", "test"], False),
        (True, False, ["manage.py", "runserver"], False),
        (False, False, ["manage.py", "runserver"], True),
    ],
    ids=["pytest", "manage.py test", "DEBUG", "production: E023"],
)
def test_the_check_refuses_it_outside_debug_and_tests(
    monkeypatch: pytest.MonkeyPatch,
    debug: bool,
    pytest_loaded: bool,
    argv: list[str],
    refused: bool,
) -> None:
    if not pytest_loaded:
        monkeypatch.delitem(sys.modules, "pytest")
    monkeypatch.setattr(sys, "argv", argv)
    with override_settings(DEBUG=debug):
        assert memory_store_errors() == (["idempotency_django.E023"] if refused else [])
