"""Reading and validating the ``Idempotency-Key`` request header."""

from __future__ import annotations

from collections.abc import Callable

from django.utils.translation import gettext_noop

MAX_KEY_LENGTH = 255


class InvalidKey(ValueError):
    """The header is present but is not a usable key; the message (English,
    ``%(name)s`` placeholders filled from ``params``) says why."""

    def __init__(self, message: str, **params: object) -> None:
        super().__init__(message % params)
        self.message = message
        self.params = params

    def translated(self, gettext: Callable[[str], str]) -> str:
        """The message in the active language, with ``gettext`` (Django's, given by the caller)."""
        return gettext(self.message) % self.params if self.params else gettext(self.message)


def parse_key(raw: str) -> str:
    """Return the key carried by a raw header value.

    Accepts 1-255 printable ASCII characters, bare or as an RFC 8941
    sf-string (``"..."``, with ``\\"`` and ``\\\\`` escapes). A comma is
    refused because servers join repeated headers with commas, so a comma
    cannot be told apart from two ``Idempotency-Key`` headers.
    """
    value = raw.strip(" \t")
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        value = _unquote_sf_string(value[1:-1])
    elif "," in value:
        raise InvalidKey(
            gettext_noop("Send exactly one Idempotency-Key header; commas are not allowed.")
        )
    if not value:
        raise InvalidKey(gettext_noop("The Idempotency-Key header is empty."))
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidKey(
            gettext_noop("The Idempotency-Key is longer than %(limit)d characters."),
            limit=MAX_KEY_LENGTH,
        )
    if not (value.isascii() and value.isprintable()):
        raise InvalidKey(
            gettext_noop("The Idempotency-Key must be printable ASCII (no control characters).")
        )
    return value


def _unquote_sf_string(inner: str) -> str:
    chars: list[str] = []
    escaped = False
    for char in inner:
        if escaped:
            if char not in '"\\':
                raise InvalidKey(gettext_noop("The quoted Idempotency-Key has an invalid escape."))
            chars.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            raise InvalidKey(gettext_noop("Send exactly one Idempotency-Key header."))
        else:
            chars.append(char)
    if escaped:
        raise InvalidKey(gettext_noop("The quoted Idempotency-Key ends with a lone backslash."))
    return "".join(chars)
