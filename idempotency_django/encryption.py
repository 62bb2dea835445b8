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
"""

from __future__ import annotations

import base64
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
    """A stored response is encrypted, and neither the key nor a fallback opens it."""


def generate_key() -> str:
    """A new random key for ``ENCRYPTION_KEY``: 32 bytes, URL-safe base64."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode("ascii")


def seal(response: StoredResponse) -> StoredResponse:
    """``response`` as the store keeps it: encrypted when ``ENCRYPTION_KEY`` is set."""
    if not idempotency_settings.ENCRYPTION_KEY:
        return response
    # ASCII JSON has no raw newline, so the first one ends the headers.
    headers = json.dumps([list(pair) for pair in response.headers], ensure_ascii=True)
    payload = headers.encode("ascii") + b"\n" + bytes(response.body)
    return StoredResponse(
        status=response.status,
        headers=((SEALED_HEADER, SCHEME),),
        # MultiFernet encrypts with the first key of _keys(): ENCRYPTION_KEY.
        body=_fernet(_keys()).encrypt(payload),
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


def _open(token: bytes) -> tuple[tuple[tuple[str, str], ...], bytes]:
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
