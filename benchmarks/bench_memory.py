"""A store in this process's memory (``BENCH_MEMORY=1``): the library's own cost, no store I/O.

Not a real store: nothing is shared between processes, and it counts no keys per
principal (``MAX_KEYS_PER_PRINCIPAL`` does not apply to it).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict

from idempotency_django.encryption import seal, unseal
from idempotency_django.stores import (
    BaseStore,
    Claim,
    KeyState,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
)

_lock = threading.Lock()
_entries: OrderedDict[RecordKey, tuple[str, str, StoredResponse | None]] = OrderedDict()
MAX_ENTRIES = 256  # then the least recently used goes: the heap (and its GCs) stays small


class MemoryStore(BaseStore):
    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        with _lock:
            entry = _entries.get(key)
            if entry is None:
                token = uuid.uuid4().hex
                _entries[key] = (token, request.fingerprint, None)
                if len(_entries) > MAX_ENTRIES:
                    _entries.popitem(last=False)
                return Claim(Outcome.CLAIMED, token=token)
            _entries.move_to_end(key)
        _token, fingerprint, response = entry
        if fingerprint != request.fingerprint:
            return Claim(Outcome.REUSED)
        if response is None:
            return Claim(Outcome.IN_PROGRESS)
        # As the real stores do, so that BENCH_ENCRYPTION=1 measures the cipher alone.
        return Claim(Outcome.REPLAY, response=unseal(response))

    def complete(self, key, token, response, retention, *, request=None):  # type: ignore[no-untyped-def]
        with _lock:
            entry = _entries.get(key)
            if entry is None or entry[0] != token:
                return False
            _entries[key] = (token, entry[1], seal(response))
        return True

    def release(self, key: RecordKey, token: str) -> None:
        with _lock:
            if key in _entries and _entries[key][0] == token:
                del _entries[key]

    def peek(self, key: RecordKey) -> Outcome | None:
        entry = _entries.get(key)
        if entry is None:
            return None
        return Outcome.IN_PROGRESS if entry[2] is None else Outcome.REPLAY

    def renew(self, key: RecordKey, token: str, lock_timeout: int, request: RequestInfo) -> bool:
        entry = _entries.get(key)
        return entry is not None and entry[0] == token

    def lookup(self, key: RecordKey) -> KeyState | None:
        return None
