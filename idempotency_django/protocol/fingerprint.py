"""What makes two requests "the same request": method, full path and raw body.

Fingerprints are keyed with ``SECRET_KEY`` (HMAC-SHA256, as Django's
``salted_hmac``): staff who can read them in the admin cannot test guesses
of a body with few possible values (a PIN, an amount). A fingerprint made
under a key in ``SECRET_KEY_FALLBACKS``, or the plain SHA-256 that 0.1 kept,
still names the same request: see :class:`Fingerprint`.

The body is read through :mod:`idempotency_django.protocol.bodies`, which keeps it
readable for the view.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.utils.crypto import salted_hmac
from django.utils.functional import cached_property
from django.utils.http import parse_header_parameters

from idempotency_django.protocol.bodies import BODY_COPY_ATTRIBUTE, body_chunks, django_request_of

FINGERPRINT_SALT = "idempotency_django.protocol.fingerprint"


class Fingerprint(str):
    """A keyed fingerprint, which knows the other values that name the same request.

    Those are computed only when a store finds a record whose fingerprint
    differs (:func:`same_request`), so a first request or a replay under the
    current key costs one digest.
    """

    #: What :func:`keyed_digest` made it of: the parts, or the function that makes them.
    _parts: Collection[bytes] | Callable[[], Iterable[bytes]] | None = None

    @cached_property  # Django's: see RecordKey.digest
    def alternatives(self) -> tuple[str, ...]:
        """Digests of the same parts under ``SECRET_KEY_FALLBACKS``, then 0.1's plain SHA-256."""
        parts = self._parts
        if parts is None:
            return ()
        hashers = [_keyed_mac(secret).copy() for secret in settings.SECRET_KEY_FALLBACKS]
        hashers.append(hashlib.sha256())
        for part in parts() if callable(parts) else parts:
            for hasher in hashers:
                hasher.update(part)
        return tuple(hasher.hexdigest() for hasher in hashers)


def keyed_digest(parts: Collection[bytes] | Callable[[], Iterable[bytes]]) -> Fingerprint:
    """HMAC-SHA256 of ``parts`` with ``SECRET_KEY``, as the admin's body digest is keyed.

    ``parts`` are the bytes, or a function that makes them (a body read in
    chunks), called again only if needed: for the digests that also count,
    under each key of ``SECRET_KEY_FALLBACKS`` and, for records 0.1 wrote, unkeyed.
    """
    mac = _keyed_mac(settings.SECRET_KEY).copy()
    for part in parts() if callable(parts) else parts:
        mac.update(part)
    fingerprint = Fingerprint(mac.hexdigest())
    fingerprint._parts = parts  # made into the other digests only when a store asks
    return fingerprint


@functools.lru_cache(maxsize=8)
def _keyed_mac(secret: str | bytes) -> Any:
    """``salted_hmac``'s HMAC under ``secret``, keyed once: its key derivation is a hash."""
    return salted_hmac(FINGERPRINT_SALT, b"", secret=secret, algorithm="sha256")


def default_fingerprint(request: HttpRequest) -> str:
    """A keyed digest of the method, the path with its query string, and the body bytes.

    Only the digest is kept; the body itself is never stored.
    """
    # Read on Django's request: DRF's Request hands each attribute on only after a
    # failed lookup, about twenty times the cost of reading it (issue 36).
    django_request = getattr(request, "_request", request)
    method = django_request.method
    path = django_request.get_full_path().encode("utf-8", "surrogateescape")
    head = (method.encode("ascii") if method else b"") + b"\n" + path + b"\n"  # _head()
    # A body Django holds in memory, unless it is multipart, is one part; any
    # other is read again only for the digests under fallback keys.
    whole = (
        getattr(django_request, BODY_COPY_ATTRIBUTE, None) is None
        and django_request.content_type != "multipart/form-data"
    )
    if whole:
        return keyed_digest((head, django_request.body))
    return keyed_digest(lambda: itertools.chain((head,), canonical_body(request)))


def _head(request: HttpRequest) -> bytes:
    """The method and the path with its query string, as every fingerprint starts."""
    method = request.method.encode("ascii") if request.method else b""
    return method + b"\n" + request.get_full_path().encode("utf-8", "surrogateescape")


#: Which parts of a request count, for people (the OpenAPI description).
default_fingerprint.description = (  # type: ignore[attr-defined]
    "the method, the path with its query string and the exact body bytes "
    "(a multipart/form-data body: its parts, whatever its boundary)"
)


def canonical_body(request: HttpRequest) -> Iterator[bytes]:
    """The body as the fingerprint sees it: the raw bytes, except for multipart.

    A ``multipart/form-data`` body becomes :func:`multipart_canonical_form`: curl,
    browsers' ``FormData`` and most clients pick a new random boundary for every
    request, so a retry's bytes differ although nothing the user sent did. A body
    that does not parse as multipart is its raw bytes, as any other body.
    """
    django_request = django_request_of(request)
    params = django_request.content_params or {}
    boundary = params.get("boundary", "") if _is_multipart(request) else ""
    if boundary:
        try:
            form = multipart_canonical_form(body_chunks(request), boundary.encode("latin-1"))
        except (MalformedMultipart, UnicodeEncodeError):
            pass
        else:
            yield from form
            return
    yield from body_chunks(request)


class MalformedMultipart(ValueError):
    """The body is not the multipart its Content-Type says: it counts byte for byte."""


def multipart_canonical_form(chunks: Iterable[bytes], boundary: bytes) -> list[bytes]:
    """One line per part, in order: its name, filename, content type and transfer
    encoding (the headers Django's parser acts on) and the SHA-256 of its content.

    The boundary, the preamble and the epilogue (which Django ignores) and the
    order or case of a part's headers are left out, so two encodings of the same form
    are one request; a different value, file, filename or part order is another.
    The content is hashed as it streams, so a large upload is never held in memory.
    Raises :class:`MalformedMultipart` where Django's parser would not find the parts.
    """
    delimiter = b"\r\n--" + boundary
    lines = [b"multipart/form-data\n"]
    buffer = b"\r\n"  # so the first delimiter is found like every other
    stream = iter(chunks)
    content: hashlib._Hash | None = None  # the part being read; None before the first
    headers: dict[str, str] = {}
    while True:
        found = buffer.find(delimiter)
        if found < 0:
            chunk = next(stream, None)
            if chunk is None:
                raise MalformedMultipart("no closing delimiter")
            if content is not None and len(buffer) > len(delimiter):
                keep = len(delimiter) - 1  # the start of a delimiter split by a chunk
                content.update(buffer[:-keep])
                buffer = buffer[-keep:]
            elif content is None and len(buffer) > len(delimiter):
                buffer = buffer[-(len(delimiter) - 1) :]  # the preamble does not count
            buffer += chunk
            continue
        if content is not None:
            content.update(buffer[:found])
            lines.append(_part_line(headers, content.hexdigest()))
        buffer = buffer[found + len(delimiter) :]
        while len(buffer) < 2:
            chunk = next(stream, None)
            if chunk is None:
                raise MalformedMultipart("the body ends inside a delimiter")
            buffer += chunk
        if buffer.startswith(b"--"):
            return lines  # the closing delimiter: what follows is the epilogue
        head_end = buffer.find(b"\r\n\r\n")
        while head_end < 0:
            chunk = next(stream, None)
            if chunk is None:
                raise MalformedMultipart("a part without the end of its headers")
            buffer += chunk
            head_end = buffer.find(b"\r\n\r\n")
        headers = _part_headers(buffer[:head_end])
        buffer = buffer[head_end + 4 :]
        content = hashlib.sha256()


def _part_headers(block: bytes) -> dict[str, str]:
    """A part's headers by lowercase name; the first line is the rest of the delimiter
    line (transport padding), never a header."""
    headers = {}
    for line in block.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            raise MalformedMultipart("a header line without a colon")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return headers


def _part_line(headers: dict[str, str], content: str) -> bytes:
    kind, parameters = parse_header_parameters(headers.get("content-disposition", ""))
    if kind.lower() != "form-data" or "name" not in parameters:
        raise MalformedMultipart("a part without a form-data name")
    content_type, type_parameters = parse_header_parameters(headers.get("content-type", ""))
    described = [
        parameters["name"],
        parameters.get("filename"),
        content_type.lower(),
        sorted((name.lower(), value) for name, value in type_parameters.items()),
        headers.get("content-transfer-encoding", "").lower(),
        content,
    ]
    return json.dumps(described, separators=(",", ":")).encode() + b"\n"


def _is_multipart(request: HttpRequest) -> bool:
    return django_request_of(request).content_type == "multipart/form-data"


class JSONFingerprint:
    """A fingerprint over the method, the path and some fields of a JSON body.

    Built by :func:`json_fields` and :func:`ignore_json_fields`. The fields are
    compared as JSON values, so key order and whitespace do not matter; a body
    that is not a JSON object is compared byte for byte, as by default.
    """

    def __init__(self, *, only: tuple[str, ...] = (), ignore: tuple[str, ...] = ()) -> None:
        self.only, self.ignore = only, ignore

    @property
    def description(self) -> str:
        """Which parts of a request count, for people (the OpenAPI description)."""
        if self.only:
            fields = ", ".join(f"`{name}`" for name in self.only)
            return f"the method, the path and the JSON body's fields {fields}"
        fields = ", ".join(f"`{name}`" for name in self.ignore)
        return f"the method, the path and the JSON body without its fields {fields}"

    def __call__(self, request: HttpRequest) -> str:
        try:
            document = json.loads(b"".join(body_chunks(request)))
        except (ValueError, RecursionError):  # not JSON, or nested too deep for the parser
            document = None
        if not isinstance(document, dict):
            return default_fingerprint(request)
        if self.only:
            kept = {name: document[name] for name in self.only if name in document}
        else:
            kept = {name: value for name, value in document.items() if name not in self.ignore}
        canonical = json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()

        # "json" never makes the digest of a raw body.
        parts = (_head(request) + b"\njson\n", canonical)
        return keyed_digest(parts)

    def __repr__(self) -> str:
        fields = self.only or self.ignore
        kind = "json_fields" if self.only else "ignore_json_fields"
        return f"{kind}({', '.join(map(repr, fields))})"


def json_fields(*names: str) -> JSONFingerprint:
    """Requests are the same when the method, the path and these JSON fields are.

    For ``@idempotent(fingerprint=json_fields("slot", "customer"))``: a retry
    whose body differs elsewhere (a client timestamp, a nonce) replays.
    """
    if not names:
        raise ValueError("json_fields() needs the names of the fields that count.")
    return JSONFingerprint(only=names)


def ignore_json_fields(*names: str) -> JSONFingerprint:
    """Requests are the same when everything but these JSON fields is."""
    if not names:
        raise ValueError("ignore_json_fields() needs the names of the fields to ignore.")
    return JSONFingerprint(ignore=names)
