"""Stored responses encrypted at rest, with ``IDEMPOTENCY["ENCRYPTION_KEY"]``.

A stored response holds other people's data (names, addresses, invoices) for
``RETENTION`` seconds, and with it every database dump, replica and Redis
snapshot does. With a key set, the stores keep its headers and body as one
Fernet token (AES-128-CBC and HMAC-SHA256, from the ``cryptography``
package) instead; the status stays readable, for the admin and ``lookup``.

``ENCRYPTION_KEY`` and ``ENCRYPTION_KEY_FALLBACKS`` work like ``SECRET_KEY``
and ``SECRET_KEY_FALLBACKS``: the key encrypts, it and the fallbacks decrypt
(:class:`~cryptography.fernet.MultiFernet`). With fallbacks alone, nothing new
is encrypted and live encrypted records still replay: encryption turned off.
A record written before encryption was turned on carries no mark and is
replayed as it is; one that no key opens raises
:class:`UndecryptableResponse`, a :class:`~idempotency_django.stores.base.StoreUnavailable`:
the retry gets ``503 idempotency_unavailable`` and nothing runs, because
running the work again would do it twice, and replaying is impossible.

A sealed answer is bound to its record: the token holds the record's digest
(:attr:`~idempotency_django.stores.base.RecordKey.digest`, a hash of its
principal, location and key) and its kind, checked when it is opened. One
copied into another record (by whoever can write the table or the Redis keys)
opens as :class:`ForeignResponse`, another ``503``, and is never replayed. A
token sealed before answers were bound (scheme ``fernet-1``) has no binding
and opens as it is, until it expires.
"""

from __future__ import annotations

import base64
import functools
import json
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed

from idempotency_django.conf import SETTING_NAME, idempotency_settings
from idempotency_django.stores.base import RecordKey, StoredResponse, StoreUnavailable

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

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

#: The one "header" of an encrypted record. Its name starts with a colon, which
#: no HTTP/1.1 header name may hold, so no response's own headers can look like it.
SEALED_HEADER = ":idempotency-encrypted"
#: Its value: the scheme, so that another one can come later beside it. "fernet-2"
#: binds the answer to its record; "fernet-1" (before) did not.
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
    """``response`` as the store keeps it for the record ``key`` of ``kind``: encrypted
    when ``ENCRYPTION_KEY`` is set, and bound to that record.

    Without ``key`` (a store of a project's own written for an earlier version),
    sealed unbound as before, with a ``DeprecationWarning``.
    """
    if not idempotency_settings.ENCRYPTION_KEY:
        return response
    # ASCII JSON has no raw newline, so the first one ends the binding, the next the headers.
    headers = json.dumps([list(pair) for pair in response.headers], ensure_ascii=True)
    payload = headers.encode("ascii") + b"\n" + bytes(response.body)
    if key is None:
        warnings.warn(
            "seal() without the record's key seals an answer any record would replay: "
            "pass the RecordKey and the kind (see docs/writing-a-store.md).",
            DeprecationWarning,
            stacklevel=2,
        )
    else:
        payload = _binding(key.digest, kind) + b"\n" + payload
    return StoredResponse(
        status=response.status,
        headers=((SEALED_HEADER, SCHEME if key is not None else "fernet-1"),),
        # MultiFernet encrypts with the first key of _keys(): ENCRYPTION_KEY.
        body=_fernet(_keys()).encrypt(payload),
        body_omitted=response.body_omitted,
    )


def unseal(
    response: StoredResponse, key: RecordKey | None = None, kind: str = "request"
) -> StoredResponse:
    """The response a store read for the record ``key`` of ``kind``, decrypted; one
    without the mark as it is.

    Raises :class:`ForeignResponse` when it was sealed for another record (not
    checked without ``key``), :class:`UndecryptableResponse` when no key opens it.
    """
    if not is_sealed(response.headers):
        return response
    headers, body = _open(response.body, None if key is None else (key.digest, kind))
    return StoredResponse(
        status=response.status, headers=headers, body=body, body_omitted=response.body_omitted
    )


def open_columns(
    headers: Any, body: bytes | memoryview | None, digest: str, kind: str
) -> tuple[Any, bytes]:
    """A record's stored headers and body, decrypted when they are (for the admin).

    ``digest`` and ``kind`` are the record's columns. Raises
    :class:`UndecryptableResponse` when no key opens them, :class:`ForeignResponse`
    when they were sealed for another record.
    """
    data = bytes(body or b"")
    if not is_sealed(headers):
        return headers, data
    opened_headers, opened_body = _open(data, (digest, kind))
    return [list(pair) for pair in opened_headers], opened_body


def is_sealed(headers: Any) -> bool:
    """True for the headers of an encrypted record: the mark alone."""
    if not headers or len(headers) != 1:
        return False
    pair = headers[0]
    return isinstance(pair, (list, tuple)) and len(pair) == 2 and pair[0] == SEALED_HEADER


def invalid_keys(key: Any, fallbacks: Any) -> list[str]:
    """What is wrong with ``ENCRYPTION_KEY`` and ``ENCRYPTION_KEY_FALLBACKS``, for the check.

    Never a key itself: the check's output ends up in logs and CI output.
    """
    problems = []
    named: list[tuple[str, Any]] = []
    if key is not None:
        named.append(("IDEMPOTENCY['ENCRYPTION_KEY']", key))
    if isinstance(fallbacks, (str, bytes)) or not isinstance(fallbacks, Sequence):
        problems.append("IDEMPOTENCY['ENCRYPTION_KEY_FALLBACKS'] must be a list of keys")
    else:
        named.extend(
            (f"IDEMPOTENCY['ENCRYPTION_KEY_FALLBACKS'][{index}]", value)
            for index, value in enumerate(fallbacks)
        )
    for name, value in named:
        try:
            raw = base64.urlsafe_b64decode(value)  # as Fernet(value) decodes it
        except (ValueError, TypeError):  # binascii.Error is a ValueError
            problems.append(f"{name} is not a URL-safe base64 string")
            continue
        if len(raw) != 32:
            problems.append(f"{name} decodes to {len(raw)} bytes instead of 32")
    return problems


def _binding(digest: str, kind: str) -> bytes:
    """The first line of a bound payload: a JSON object, where an unbound one starts
    with its headers' JSON list, so the two are told apart inside the ciphertext
    (a changed scheme mark outside it changes nothing)."""
    return json.dumps({"record": digest, "kind": kind}, ensure_ascii=True).encode("ascii")


def _open(
    token: bytes, record: tuple[str, str] | None
) -> tuple[tuple[tuple[str, str], ...], bytes]:
    keys = _keys()
    if not keys:
        raise UndecryptableResponse(
            "A stored response is encrypted, and IDEMPOTENCY has no ENCRYPTION_KEY "
            "or ENCRYPTION_KEY_FALLBACKS."
        )
    fernet = _fernet(keys)  # first: it says so when cryptography is missing
    from cryptography.fernet import InvalidToken

    try:
        payload = fernet.decrypt(bytes(token))
    except InvalidToken:
        # No "from": the cause would only say InvalidToken, and the log's
        # error field names the exception's cause first.
        raise UndecryptableResponse(
            "A stored response is encrypted with neither IDEMPOTENCY['ENCRYPTION_KEY'] "
            "nor a key of ENCRYPTION_KEY_FALLBACKS (or was altered)."
        ) from None
    if payload.startswith(b"{"):
        line, _, payload = payload.partition(b"\n")
        try:
            bound = json.loads(line)
            sealed_for = (str(bound["record"]), str(bound["kind"]))
        except (ValueError, TypeError, KeyError):
            raise UndecryptableResponse("A decrypted stored response is malformed.") from None
        if record is not None and sealed_for != record:
            raise ForeignResponse(
                f"The stored response of record {record[0][:16]} ({record[1]}) was sealed "
                f"for record {sealed_for[0][:16]} ({sealed_for[1]}): it is not replayed."
            )
    # Otherwise sealed before answers were bound: it opens as it is until it expires.
    line, _, body = payload.partition(b"\n")
    try:
        headers = tuple((str(name), str(value)) for name, value in json.loads(line))
    except (ValueError, TypeError):
        # Only a writer holding a key can get here: still no 500, and no payload in the log.
        raise UndecryptableResponse("A decrypted stored response is malformed.") from None
    return headers, body


def _keys() -> tuple[str | bytes, ...]:
    """The key that encrypts (when set) first, then the fallbacks: MultiFernet's order."""
    key = idempotency_settings.ENCRYPTION_KEY
    return (*((key,) if key else ()), *idempotency_settings.ENCRYPTION_KEY_FALLBACKS)


@functools.cache
def _fernet(keys: tuple[str | bytes, ...]) -> MultiFernet:
    # Imported here: without keys the package needs no cryptography.
    try:
        from cryptography.fernet import Fernet, MultiFernet
    except ImportError:
        raise StoreUnavailable(
            "IDEMPOTENCY['ENCRYPTION_KEY'] or ENCRYPTION_KEY_FALLBACKS is set, but the "
            "cryptography package is not installed (pip install 'idempotency-django[encryption]')."
        ) from None
    try:
        return MultiFernet([Fernet(key) for key in keys])
    except (ValueError, TypeError):
        # Never the key in the message: it ends up in logs (check E015 says which one).
        raise StoreUnavailable(
            "IDEMPOTENCY['ENCRYPTION_KEY'] or ENCRYPTION_KEY_FALLBACKS holds a malformed key "
            "(system check E015)."
        ) from None


def _forget_keys(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        _fernet.cache_clear()


setting_changed.connect(_forget_keys)
