"""Stored responses encrypted at rest, with the keys of ``IDEMPOTENCY["ENCRYPTION_KEYS"]``.

A stored response holds other people's data (names, addresses, invoices) for
``RETENTION`` seconds, and with it every database dump, replica and Redis
snapshot does. With keys set, the stores keep its headers and body as one
Fernet token (AES-128-CBC and HMAC-SHA256, from the ``cryptography``
package) instead; the status stays readable, for the admin and ``lookup``.

Keys work like ``SECRET_KEY`` and ``SECRET_KEY_FALLBACKS``: the first one
encrypts, every one decrypts (:class:`~cryptography.fernet.MultiFernet`).
A record written before encryption was turned on carries no mark and is
replayed as it is; one that no key opens raises
:class:`UndecryptableResponse`, a :class:`~idempotency_django.stores.base.StoreUnavailable`:
the retry gets ``503 idempotency_unavailable`` and nothing runs, because
running the work again would do it twice, and replaying is impossible.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed

from idempotency_django.conf import SETTING_NAME, idempotency_settings
from idempotency_django.stores.base import StoredResponse, StoreUnavailable

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

__all__ = [
    "SEALED_HEADER",
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
#: Its value: the scheme, so that another one can come later beside it.
SCHEME = "fernet-1"


class UndecryptableResponse(StoreUnavailable):
    """A stored response is encrypted, and no key of ``ENCRYPTION_KEYS`` opens it."""


def generate_key() -> str:
    """A new random key for ``ENCRYPTION_KEYS``: 32 bytes, URL-safe base64."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode("ascii")


def seal(response: StoredResponse) -> StoredResponse:
    """``response`` as the store keeps it: encrypted when ``ENCRYPTION_KEYS`` is set."""
    keys = idempotency_settings.ENCRYPTION_KEYS
    if not keys:
        return response
    payload = _headers_line(response.headers) + b"\n" + bytes(response.body)
    return StoredResponse(
        status=response.status,
        headers=((SEALED_HEADER, SCHEME),),
        body=_fernet(tuple(keys)).encrypt(payload),
        body_omitted=response.body_omitted,
    )


def unseal(response: StoredResponse) -> StoredResponse:
    """The response a store read, decrypted; one without the mark as it is."""
    if not is_sealed(response.headers):
        return response
    headers, body = _open(response.body)
    return StoredResponse(
        status=response.status, headers=headers, body=body, body_omitted=response.body_omitted
    )


def open_columns(headers: Any, body: bytes | memoryview | None) -> tuple[Any, bytes]:
    """A record's stored headers and body, decrypted when they are (for the admin).

    Raises :class:`UndecryptableResponse` when no key opens them.
    """
    data = bytes(body or b"")
    if not is_sealed(headers):
        return headers, data
    opened_headers, opened_body = _open(data)
    return [list(pair) for pair in opened_headers], opened_body


def is_sealed(headers: Any) -> bool:
    """True for the headers of an encrypted record: the mark alone."""
    if not headers or len(headers) != 1:
        return False
    pair = headers[0]
    return isinstance(pair, (list, tuple)) and len(pair) == 2 and pair[0] == SEALED_HEADER


def invalid_keys(keys: Any) -> list[str]:
    """What is wrong with an ``ENCRYPTION_KEYS`` value, for the system check.

    Never a key itself: the check's output ends up in logs and CI output.
    """
    if keys is None:
        return []
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        return ["must be a list of keys, not a single value"]
    problems = []
    for index, key in enumerate(keys):
        try:
            raw = _decoded(key)
        except ValueError:
            problems.append(f"key {index} is not URL-safe base64")
            continue
        if len(raw) != 32:
            problems.append(f"key {index} decodes to {len(raw)} bytes instead of 32")
    return problems


def _decoded(key: Any) -> bytes:
    if isinstance(key, str):
        key = key.encode("ascii", "replace")
    if not isinstance(key, bytes):
        raise ValueError("not a string")
    try:
        return base64.urlsafe_b64decode(key)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from exc


def _open(token: bytes) -> tuple[tuple[tuple[str, str], ...], bytes]:
    keys = idempotency_settings.ENCRYPTION_KEYS
    if not keys:
        raise UndecryptableResponse(
            "A stored response is encrypted and IDEMPOTENCY['ENCRYPTION_KEYS'] is empty."
        )
    from cryptography.fernet import InvalidToken

    try:
        payload = _fernet(tuple(keys)).decrypt(bytes(token))
    except InvalidToken:
        # No "from": the cause would only say InvalidToken, and the log's
        # error field names the exception's cause first.
        raise UndecryptableResponse(
            "A stored response is encrypted with no key of IDEMPOTENCY['ENCRYPTION_KEYS'] "
            "(or was altered)."
        ) from None
    line, _, body = payload.partition(b"\n")
    try:
        headers = tuple((str(name), str(value)) for name, value in json.loads(line))
    except (ValueError, TypeError):
        # Only a writer holding a key can get here: still no 500, and no payload in the log.
        raise UndecryptableResponse("A decrypted stored response is malformed.") from None
    return headers, body


def _headers_line(headers: tuple[tuple[str, str], ...]) -> bytes:
    # ASCII JSON has no raw newline, so the first one ends the headers.
    return json.dumps([list(pair) for pair in headers], ensure_ascii=True).encode("ascii")


@functools.cache
def _fernet(keys: tuple[str | bytes, ...]) -> MultiFernet:
    # Imported here: without keys the package needs no cryptography.
    try:
        from cryptography.fernet import Fernet, MultiFernet
    except ImportError:
        raise StoreUnavailable(
            "IDEMPOTENCY['ENCRYPTION_KEYS'] is set, but the cryptography package is not "
            "installed (pip install 'idempotency-django[encryption]')."
        ) from None
    try:
        return MultiFernet([Fernet(key) for key in keys])
    except (ValueError, TypeError):
        # Never the key in the message: it ends up in logs (check E015 says which one).
        raise StoreUnavailable(
            "IDEMPOTENCY['ENCRYPTION_KEYS'] holds a malformed key (system check E015)."
        ) from None


def _forget_keys(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        _fernet.cache_clear()


setting_changed.connect(_forget_keys)
