"""The store docs/writing-a-store.md builds; test_dict_store.py proves it with the contract."""

from __future__ import annotations

# --8<-- [start:store]
import threading
import time
import uuid

from idempotency_django.stores import (
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


class DictStore(BaseStore):
    """One dict behind one lock: each entry is [token, fingerprint, expires_at, response]."""

    def __init__(self, **options):
        super().__init__(**options)
        self.lock = threading.Lock()
        self.entries = {}

    def live(self, key):
        entry = self.entries.get(key.digest)
        return entry if entry and entry[2] > time.monotonic() else None

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        with self.lock:
            entry = self.live(key)
            if entry is None:  # free, expired, or abandoned past its lock timeout
                token = uuid.uuid4().hex
                expires_at = time.monotonic() + lock_timeout
                self.entries[key.digest] = [token, request.fingerprint, expires_at, None]
                return Claim(Outcome.CLAIMED, token=token)
            _token, fingerprint, _expires_at, response = entry
        if not same_request(fingerprint, request.fingerprint):
            return Claim(Outcome.REUSED)
        if response is None:
            return Claim(Outcome.IN_PROGRESS)
        return Claim(Outcome.REPLAY, response=unseal(response, key, request.kind))

    def complete(
        self,
        key: RecordKey,
        token: str,
        response: StoredResponse,
        retention: int,
        *,
        request: RequestInfo | None = None,
    ) -> bool:
        # Encrypted when ENCRYPTION_KEY is set, and bound to this record.
        sealed = seal(response, key, request.kind if request else "request")
        with self.lock:
            entry = self.entries.get(key.digest)
            if entry and entry[0] == token and entry[3] is None:
                entry[2:] = [time.monotonic() + retention, sealed]
                return True
            if request is None or self.live(key) is not None:
                return False  # another request owns the key, or it is already answered
            # Our reservation expired and nobody claimed the key since: keep the answer.
            expires_at = time.monotonic() + retention
            self.entries[key.digest] = [token, request.fingerprint, expires_at, sealed]
            return True

    def release(self, key: RecordKey, token: str) -> None:
        with self.lock:
            entry = self.entries.get(key.digest)
            if entry and entry[0] == token and entry[3] is None:
                del self.entries[key.digest]

    def renew(
        self,
        key: RecordKey,
        token: str,
        lock_timeout: int,
        request: RequestInfo,
        *,
        remake: bool = True,
    ) -> bool:
        with self.lock:
            entry = self.entries.get(key.digest)
            if entry and entry[0] == token and entry[3] is None:
                entry[2] = time.monotonic() + lock_timeout
                return True
            if self.live(key) is not None or not remake:
                return False  # taken over, or released (the heartbeat brings nothing back)
            expires_at = time.monotonic() + lock_timeout
            self.entries[key.digest] = [token, request.fingerprint, expires_at, None]
            return True

    def peek(self, key: RecordKey) -> Outcome | None:
        with self.lock:
            entry = self.live(key)
        if entry is None:
            return None
        return Outcome.IN_PROGRESS if entry[3] is None else Outcome.REPLAY

    def lookup(self, key: RecordKey) -> KeyState | None:
        with self.lock:
            entry = self.live(key)
        if entry is None:
            return None
        status = None if entry[3] is None else entry[3].status
        state = "in_progress" if entry[3] is None else "completed"
        return KeyState(state=state, status=status, expires_in=entry[2] - time.monotonic())

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()


# --8<-- [end:store]
