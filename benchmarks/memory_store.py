"""A store that keeps everything in this process's memory, to measure the library alone.

Not part of the library, and not a real store (nothing is shared between
processes, nothing expires): the benchmark's ``postgres_memory`` variant
selects it (``BENCH_MEMORY_STORE=1``) so that the first request's cost splits
into the library's own Python (this variant against the bare view) and the
store's statements (the PostgreSQL variant against this one).
"""

from __future__ import annotations

import threading
import uuid

from idempotency_django.stores import (
    BaseStore,
    Claim,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
)

_lock = threading.Lock()
_entries: dict[RecordKey, tuple[str, str, StoredResponse | None]] = {}


class MemoryStore(BaseStore):
    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        with _lock:
            entry = _entries.get(key)
            if entry is None:
                token = uuid.uuid4().hex
                _entries[key] = (token, request.fingerprint, None)
                return Claim(Outcome.CLAIMED, token=token)
        _token, fingerprint, response = entry
        if fingerprint != request.fingerprint:
            return Claim(Outcome.REUSED)
        if response is None:
            return Claim(Outcome.IN_PROGRESS)
        return Claim(Outcome.REPLAY, response=response)

    def complete(
        self,
        key: RecordKey,
        token: str,
        response: StoredResponse,
        retention: int,
        *,
        request: RequestInfo | None = None,
    ) -> bool:
        with _lock:
            entry = _entries.get(key)
            if entry is None or entry[0] != token:
                return False
            _entries[key] = (token, entry[1], response)
        return True

    def release(self, key: RecordKey, token: str) -> None:
        with _lock:
            if key in _entries and _entries[key][0] == token:
                del _entries[key]
