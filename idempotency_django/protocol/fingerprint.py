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
    #: Unset on one made otherwise, which has no alternatives: the stores read them
    #: with ``getattr(fingerprint, "alternatives", ())``, as of any string.
    _parts: Collection[bytes] | Callable[[], Iterable[bytes]]

    @cached_property  # Django's: see RecordKey.digest
    def alternatives(self) -> tuple[str, ...]:
        """Digests of the same parts under ``SECRET_KEY_FALLBACKS``, then 0.1's plain SHA-256."""
        parts = self._parts
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

    The boundary, the order or case of a part's headers, and a preamble and an
    epilogue that Django ignores are left out, so two encodings of the same form
    are one request; a different value, file, filename or part order is another.
    The content is hashed as it streams, so a large upload is never held in memory.

    Django's parser splits the body at every ``--boundary`` and reads a part
    wherever a header line follows one. Raises :class:`MalformedMultipart` for any
    body where that could read another form than this does: a header line
    (a colon) in the preamble, the transport padding or the epilogue, a
    ``--boundary`` without the CRLF of a delimiter before it.
    """
    dash = b"--" + boundary
    # What a chunk may end inside of: a delimiter's CRLF and all but one byte of its dash.
    keep = len(dash) + 1
    lines = [b"multipart/form-data\n"]
    buffer = b""
    stream = iter(chunks)
    content: hashlib._Hash | None = None  # the part being read; None before the first
    headers: dict[str, str] = {}
    while True:
        found = buffer.find(dash)
        if found < 0:
            chunk = next(stream, None)
            if chunk is None:
                raise MalformedMultipart("no closing delimiter")
            if len(buffer) > keep:
                if content is None:
                    _ignored(buffer[:-keep], "the preamble")
                else:
                    content.update(buffer[:-keep])
                buffer = buffer[-keep:]
            buffer += chunk
            continue
        if content is None:
            _ignored(buffer[:found], "the preamble")
        elif buffer[max(0, found - 2) : found] != b"\r\n":
            raise MalformedMultipart("a boundary without the CRLF of a delimiter before it")
        else:
            content.update(buffer[: found - 2])
            lines.append(_part_line(headers, content.hexdigest()))
        buffer = buffer[found + len(dash) :]
        while len(buffer) < 2:
            chunk = next(stream, None)
            if chunk is None:
                raise MalformedMultipart("the body ends inside a delimiter")
            buffer += chunk
        if buffer.startswith(b"--"):  # the closing delimiter
            _ignored(buffer, "the epilogue")
            for chunk in stream:
                _ignored(chunk, "the epilogue")
            return lines
        head_end = buffer.find(b"\r\n\r\n")
        while head_end < 0:
            chunk = next(stream, None)
            if chunk is None:
                raise MalformedMultipart("a part without the end of its headers")
            buffer += chunk
            head_end = buffer.find(b"\r\n\r\n")
        if dash in buffer[:head_end]:
            raise MalformedMultipart("a boundary in a part's headers")
        headers = _part_headers(buffer[:head_end])
        buffer = buffer[head_end + 4 :]
        content = hashlib.sha256()


def _ignored(text: bytes, where: str) -> None:
    """``text`` is left out of the form (a preamble, an epilogue, transport padding): it
    must hold no header line, or Django's parser might read a part in it."""
    if b":" in text:
        raise MalformedMultipart(f"a header line in {where}")


def _part_headers(block: bytes) -> dict[str, str]:
    """A part's headers by lowercase name; the first line is the rest of the delimiter
    line (transport padding), never a header."""
    padding, _, block = block.partition(b"\r\n")
    _ignored(padding, "the transport padding")
    headers = {}
    for line in block.split(b"\r\n") if block else ():
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
