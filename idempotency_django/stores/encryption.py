"""Stored responses encrypted at rest with ``ENCRYPTION_KEY``: docs/settings.md says how.

A store keeps a response's headers and body as one Fernet token bound to its record (its
digest and kind), and the status readable. A token no key opens raises a ``StoreUnavailable``:
the retry gets ``503`` and nothing runs, since running it again would do the work twice.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import warnings
from collections.abc import Sequence
from typing import Any

from idempotency_django.conf import idempotency_settings
from idempotency_django.stores.base import RecordKey, StoredResponse, StoreUnavailable

try:  # needed only with keys set
    from cryptography import fernet
except ImportError:
    fernet = None  # type: ignore[assignment]

__all__ = [
    "SEALED_HEADER",
    "ForeignResponse",
    "UndecryptableResponse",
    "generate_key",
    "invalid_keys",
    "is_sealed",
    "open_columns",
    "seal",
    "unseal",
]

#: The one "header" of an encrypted record; no HTTP/1.1 header name may hold its colon.
SEALED_HEADER = ":idempotency-encrypted"
#: Its value. "fernet-2" binds the answer to its record; "fernet-1" (before) did not.
SCHEME = "fernet-2"


class UndecryptableResponse(StoreUnavailable):
    """A stored response is encrypted, and neither the key nor a fallback opens it."""


class ForeignResponse(UndecryptableResponse):
    """A stored response opens, but was sealed for another record: it is not this one's answer."""


def generate_key() -> str:
    """A new random key for ``ENCRYPTION_KEY``: 32 bytes, URL-safe base64."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode("ascii")


def seal(
    response: StoredResponse, key: RecordKey | None = None, kind: str = "request"
) -> StoredResponse:
    """``response`` as the store keeps it for the record ``key`` of ``kind``: encrypted and
    bound to that record when ``ENCRYPTION_KEY`` is set. Without ``key`` (a store written for
    an earlier version), unbound, with a ``DeprecationWarning``."""
    if not idempotency_settings.ENCRYPTION_KEY:
        return response
    # One ASCII JSON line (no raw newline) each: the binding, then the headers, then the body.
    payload = _line(response.headers) + bytes(response.body)
    if key is None:
        warnings.warn(
            "seal() without the record's key seals an answer any record would replay: "
            "pass the RecordKey and the kind (see docs/writing-a-store.md).",
            DeprecationWarning,
            stacklevel=2,
        )
    else:  # an object, where an unbound payload starts with its headers' list
        payload = _line({"record": key.digest, "kind": kind}) + payload
    return dataclasses.replace(
        response,
        headers=((SEALED_HEADER, "fernet-1" if key is None else SCHEME),),
        body=_fernet().encrypt(payload),  # with the first key: ENCRYPTION_KEY
    )


def unseal(
    response: StoredResponse, key: RecordKey | None = None, kind: str = "request"
) -> StoredResponse:
    """The response a store read for the record ``key`` of ``kind``, decrypted; one
    without the mark as it is. Raises :class:`ForeignResponse` when it was sealed for
    another record (unchecked without ``key``), :class:`UndecryptableResponse` when no
    key opens it."""
    if not is_sealed(response.headers):
        return response
    headers, body = _open(response.body, None if key is None else (key.digest, kind))
    return dataclasses.replace(response, headers=headers, body=body)


def open_columns(
    headers: Any, body: bytes | memoryview | None, digest: str, kind: str
) -> tuple[Any, bytes]:
    """A record's stored headers and body columns, decrypted when they are; raises as
    :func:`unseal`."""
    if not is_sealed(headers):
        return headers, bytes(body or b"")
    opened, body = _open(bytes(body or b""), (digest, kind))
    return [list(pair) for pair in opened], body


def is_sealed(headers: Any) -> bool:
    """True for the headers of an encrypted record: the mark alone."""
    match headers:
        case [[name, _]]:
            return bool(name == SEALED_HEADER)
    return False


def invalid_keys(key: Any, fallbacks: Any) -> list[str]:
    """What is wrong with ``ENCRYPTION_KEY`` and ``ENCRYPTION_KEY_FALLBACKS``, for check
    E015: never a key itself, since the check's output ends up in logs."""
    problems, named = [], {} if key is None else {"IDEMPOTENCY['ENCRYPTION_KEY']": key}
    if isinstance(fallbacks, (str, bytes)) or not isinstance(fallbacks, Sequence):
        problems.append("IDEMPOTENCY['ENCRYPTION_KEY_FALLBACKS'] must be a list of keys")
        fallbacks = ()
    for index, value in enumerate(fallbacks):
        named[f"IDEMPOTENCY['ENCRYPTION_KEY_FALLBACKS'][{index}]"] = value
    for name, value in named.items():
        try:
            length = len(base64.urlsafe_b64decode(value))  # as Fernet(value) decodes it
        except (ValueError, TypeError):  # binascii.Error is a ValueError
            problems.append(f"{name} is not a URL-safe base64 string")
            continue
        if length != 32:
            problems.append(f"{name} decodes to {length} bytes instead of 32")
    return problems


def _line(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=True).encode("ascii") + b"\n"


def _open(token: bytes, record: tuple[str, str] | None) -> tuple[Any, bytes]:
    cipher = _fernet()  # first: it says so when there are no keys, or no cryptography
    try:
        payload = cipher.decrypt(bytes(token))
    except fernet.InvalidToken:
        # No "from": the log's error field names the cause first, and it would say InvalidToken.
        raise UndecryptableResponse(
            "A stored response is encrypted with neither IDEMPOTENCY['ENCRYPTION_KEY'] "
            "nor a key of ENCRYPTION_KEY_FALLBACKS (or was altered)."
        ) from None
    # Only a writer holding a key can make one malformed: still no 500, no payload in the log.
    try:
        if payload.startswith(b"{"):  # bound; else sealed before, opened as it is until it expires
            line, _, payload = payload.partition(b"\n")
            bound = json.loads(line)
            sealed_for = (str(bound["record"]), str(bound["kind"]))
            if record is not None and sealed_for != record:
                raise ForeignResponse(
                    f"The stored response of record {record[0][:16]} ({record[1]}) was sealed "
                    f"for record {sealed_for[0][:16]} ({sealed_for[1]}): it is not replayed."
                )
        line, _, body = payload.partition(b"\n")
        return tuple((str(name), str(value)) for name, value in json.loads(line)), body
    except (ValueError, TypeError, KeyError):
        raise UndecryptableResponse("A decrypted stored response is malformed.") from None


def _fernet() -> fernet.MultiFernet:
    """The key that encrypts (when set) first, then the fallbacks: MultiFernet's order."""
    key = idempotency_settings.ENCRYPTION_KEY
    keys = (*((key,) if key else ()), *idempotency_settings.ENCRYPTION_KEY_FALLBACKS)
    if not keys:
        raise UndecryptableResponse(
            "A stored response is encrypted, and IDEMPOTENCY has no ENCRYPTION_KEY "
            "or ENCRYPTION_KEY_FALLBACKS."
        )
    if fernet is None:
        raise StoreUnavailable(
            "IDEMPOTENCY['ENCRYPTION_KEY'] or ENCRYPTION_KEY_FALLBACKS is set, but the "
            "cryptography package is not installed (pip install 'idempotency-django[encryption]')."
        )
    return _multi_fernet(keys)


@functools.lru_cache(maxsize=8)  # keyed by the keys: a changed setting misses it
def _multi_fernet(keys: tuple[str | bytes, ...]) -> fernet.MultiFernet:
    try:
        return fernet.MultiFernet([fernet.Fernet(key) for key in keys])
    except (ValueError, TypeError):  # never the key in the message (check E015 says which)
        raise StoreUnavailable(
            "IDEMPOTENCY['ENCRYPTION_KEY'] or ENCRYPTION_KEY_FALLBACKS holds a malformed key "
            "(system check E015)."
        ) from None
