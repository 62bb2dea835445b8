"""The Redis store's value, format 1: a one-line JSON header, a newline, the body.

docs/stores.md describes the format field by field; this module writes and reads
it, and converts what redis-py hands back.
"""

from __future__ import annotations

import json
from typing import Any

from idempotency_django.stores.base import RecordKey, StoredResponse, StoreUnavailable
from idempotency_django.stores.encryption import unseal

FORMAT_VERSION = 1
IN_PROGRESS = "in_progress"
COMPLETED = "completed"


def reservation(token: str, fingerprint: str) -> bytes:
    """The value of a reservation: its header line and an empty body."""
    head = {"v": FORMAT_VERSION, "state": IN_PROGRESS, "token": token, "fp": fingerprint}
    return compact_json(head) + b"\n"


def milliseconds(seconds: int) -> int:
    return max(1, int(seconds * 1000))


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def compact_json(value: Any) -> bytes:
    """Compact ASCII JSON: never a raw newline, whatever the header values hold."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def decode_response(value: Any, key: RecordKey, kind: str) -> StoredResponse:
    """The response kept in the completed value of ``key`` (format 1), decrypted when it is."""
    head_bytes, _, body = as_bytes(value).partition(b"\n")
    try:
        head = json.loads(head_bytes)
        stored = StoredResponse(
            status=int(head["status"]),
            headers=tuple((str(name), str(value)) for name, value in head.get("headers") or []),
            body=body,
            body_omitted=bool(head.get("omitted", False)),
        )
        # What no answer this store wrote holds, and Django would refuse to send (a 500).
        if not 100 <= stored.status <= 599:
            raise ValueError(f"status {stored.status}")
        if any("\r" in part or "\n" in part for header in stored.headers for part in header):
            raise ValueError("a header with a line break")
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise StoreUnavailable(f"A stored response could not be decoded: {exc}") from exc
    return unseal(stored, key, kind)
