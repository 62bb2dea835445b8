"""A store in this process's memory, for tests and benchmarks (``STORE = "memory"``).

Nothing is shared between processes: two workers would each run a duplicate.
The system check E023 refuses it unless ``DEBUG`` is on or tests are running.
Times are this process's monotonic clock.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import checks

from idempotency_django.stores.base import (
    BaseStore,
    Claim,
    KeyState,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
)
from idempotency_django.stores.digests import same_request
from idempotency_django.stores.encryption import seal, unseal

IN_PROGRESS = "in_progress"
COMPLETED = "completed"
#: Expired entries are swept after this many new ones, so a long run stays bounded
#: by its live keys without a scan on every claim.
SWEEP_EVERY = 1024


@dataclass
class _Entry:
    token: str
    fingerprint: str
    expires_at: float
    #: The sealed answer; None while the entry is a reservation.
    response: StoredResponse | None = None


class MemoryStore(BaseStore):
    """Reservations and stored responses in a dict of this process, behind one lock.

    ``max_entries`` (option, default unlimited) bounds the entries: past it the
    oldest written goes, even a live one, as the benchmarks want a small heap.
    """

    counts_keys = True

    def __init__(self, max_entries: int | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[RecordKey, _Entry] = OrderedDict()
        self._added = 0

    #: The clock of every expiry: this process's monotonic one.
    now = staticmethod(time.monotonic)

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        token = secrets.token_hex(16)
        with self._lock:
            now = self.now()
            entry = self._entries.get(key)
            if entry is None or entry.expires_at <= now:
                # The digest alone (a Fingerprint also holds what it was made of).
                self._put(key, _Entry(token, str(request.fingerprint), now + lock_timeout))
                took_over = entry is not None and entry.response is None
                return Claim(Outcome.CLAIMED, token=token, took_over=took_over)
            fingerprint, response = entry.fingerprint, entry.response
        if not same_request(fingerprint, request.fingerprint):
            return Claim(Outcome.REUSED)
        if response is None:
            return Claim(Outcome.IN_PROGRESS)
        return Claim(Outcome.REPLAY, response=unseal(response, key, request.kind))

    def lookup(self, key: RecordKey) -> KeyState | None:
        with self._lock:
            entry, now = self._entries.get(key), self.now()
        if entry is None or entry.expires_at <= now:
            return None
        response = entry.response
        state, status = (IN_PROGRESS, None) if response is None else (COMPLETED, response.status)
        return KeyState(state=state, status=status, expires_in=entry.expires_at - now)

    def complete(
        self,
        key: RecordKey,
        token: str,
        response: StoredResponse,
        retention: int,
        *,
        request: RequestInfo | None = None,
    ) -> bool:
        sealed = seal(response, key, request.kind if request is not None else "request")
        remake = request.fingerprint if request is not None else None
        return self._keep(key, token, retention, sealed, remake)

    def release(self, key: RecordKey, token: str) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.token == token and entry.response is None:
                del self._entries[key]

    def renew(
        self,
        key: RecordKey,
        token: str,
        lock_timeout: int,
        request: RequestInfo,
        *,
        remake: bool = True,
    ) -> bool:
        return self._keep(key, token, lock_timeout, None, request.fingerprint if remake else None)

    def count_keys(self, key: RecordKey, lifetime: int) -> tuple[int, float | None]:
        # A scan of every entry: fine for tests and benchmarks, which this store is for.
        with self._lock:
            now = self.now()
            others = [
                entry.expires_at
                for other, entry in self._entries.items()
                if other != key and other.principal == key.principal and entry.expires_at > now
            ]
        if not others:
            return 1, None
        return len(others) + 1, min(others) - now

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def check(self) -> list[checks.CheckMessage]:
        # pytest is imported only by a test run; Django's runner leaves no such mark,
        # but ``manage.py test`` is the one way to start it.
        if settings.DEBUG or "pytest" in sys.modules or sys.argv[1:2] == ["test"]:
            return []
        return [
            checks.Error(
                "The memory store keeps keys in one process: each worker would see only "
                "its own reservations and run duplicates.",
                hint="Use it with DEBUG or in tests only; use the database or the Redis "
                "store otherwise.",
                id="idempotency_django.E023",
            )
        ]

    def _keep(
        self,
        key: RecordKey,
        token: str,
        seconds: int,
        response: StoredResponse | None,
        remake: str | None,
    ) -> bool:
        """complete() (with ``response``) and renew(): one rule for both, as the contract says.

        ``token``'s reservation lives ``seconds`` more; when the key has no live entry
        and ``remake`` (the fingerprint) is given, it is made again.
        """
        with self._lock:
            now = self.now()
            entry = self._entries.get(key)
            if entry is not None and entry.token == token and entry.response is None:
                # Ours, even past its lock timeout: nobody took it over.
                entry.response, entry.expires_at = response, now + seconds
                if response is not None:
                    self._entries.move_to_end(key)  # a completion is a write: newest last
                return True
            if remake is None or (entry is not None and entry.expires_at > now):
                return False
            self._put(key, _Entry(token, str(remake), now + seconds, response))
            return True

    def _put(self, key: RecordKey, entry: _Entry) -> None:
        """Store ``entry``, newest last; the lock is held."""
        self._entries[key] = entry
        self._entries.move_to_end(key)
        self._added += 1
        if self._added % SWEEP_EVERY == 0:
            now = self.now()
            for expired in [k for k, e in self._entries.items() if e.expires_at <= now]:
                del self._entries[expired]
        if self.max_entries is not None:
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
