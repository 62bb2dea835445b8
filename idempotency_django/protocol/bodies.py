"""The body of a keyed request, read before the view and still readable by it.

The body must be read for its fingerprint before anything else parses it
(the CSRF check reads ``request.POST``, DRF's parsers read the stream), and
without taking it from them. :func:`prepare_body` makes that possible for
every body Django accepts; :func:`body_chunks` then reads it again as often
as needed. :func:`ready_body` is when the middleware does it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.urls import ResolverMatch

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol import problems
from idempotency_django.protocol.marks import EXEMPT_ATTRIBUTE, OPTIONS_ATTRIBUTE
from idempotency_django.protocol.scope import default_scope, principal_of

#: Where a body too large to keep in memory was copied (see :func:`prepare_body`).
BODY_COPY_ATTRIBUTE = "_idempotency_body_copy"
#: Set by :func:`prepare_body` on a request whose whole body it read into ``request.body``.
PREPARED_ATTRIBUTE = "_idempotency_body_prepared"
#: Set by :func:`ready_body` on a request it has looked at: it decides once per request.
READIED_ATTRIBUTE = "_idempotency_body_readied"
CHUNK_SIZE = 64 * 1024


def prepare_body(request: HttpRequest, *, capped: bool = True) -> None:
    """Make the body readable by the fingerprint and, afterwards, by the view.

    Up to ``DATA_UPLOAD_MAX_MEMORY_SIZE`` the body is read as ``request.body``,
    which Django keeps for every later reader. A larger body (a file upload)
    is copied in chunks to a temporary file, which then stands in for the
    request's stream: Django's multipart parser still streams the upload to
    its upload handlers, and nothing holds the whole body in memory. Does
    nothing when the body was read already. ``capped=False`` leaves out
    ``MAX_FINGERPRINTED_BODY`` (a webhook delivery: its view reads the body
    anyway, and the limit is the key contract's).
    """
    request = getattr(request, "_request", request)  # django_request_of(), without the call
    if hasattr(request, BODY_COPY_ATTRIBUTE) or getattr(request, PREPARED_ATTRIBUTE, False):
        return  # readied by us already (the middleware's, handed on to phase 1)
    try:
        length = max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except ValueError:
        length = 0
    if hasattr(request, "_body"):
        if len(request._body) < length:  # read by us before, or by someone else
            raise BodyCutShort(length=length)
        return
    if getattr(request, "_read_started", False):
        return  # consumed by someone else: request.body will say so
    cap = idempotency_settings.MAX_FINGERPRINTED_BODY if capped else None
    if cap is not None and length > cap:
        raise BodyTooLarge(limit=cap)
    limit: int | None = settings.DATA_UPLOAD_MAX_MEMORY_SIZE  # None in Django, not in its stubs
    if limit is None or length <= limit:
        if len(request.body) < length:  # Django reads it once and keeps it
            raise BodyCutShort(length=length)
        setattr(request, PREPARED_ATTRIBUTE, True)
        return
    stream: Any = request._stream
    # Deleted when closed, at the latest when the request is garbage-collected.
    copy = tempfile.NamedTemporaryFile(  # noqa: SIM115
        prefix="idempotency-body-", dir=settings.FILE_UPLOAD_TEMP_DIR
    )
    remaining = length
    while remaining > 0:
        chunk = stream.read(min(CHUNK_SIZE, remaining))
        if not chunk:
            break
        copy.write(chunk)
        remaining -= len(chunk)
    if remaining > 0:
        copy.close()
        raise BodyCutShort(length=length)
    copy.flush()
    copy.seek(0)
    replacement: Any = LimitedStream(copy, length)  # type: ignore[arg-type]
    request._stream = replacement
    setattr(request, BODY_COPY_ATTRIBUTE, copy)
    _close_with_request(request, copy)


def kept_by_django(request: HttpRequest) -> bool:
    """Whether ``request.body`` would hold the whole body in memory, within the limits.

    Not multipart (an upload may be larger than memory should hold); a
    ``Content-Length`` within ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (``request.body``
    refuses more) and within ``MAX_FINGERPRINTED_BODY`` (answered 413 before
    anything reads it). Without one (a chunked body under ASGI) nothing bounds
    what would be read: not kept.
    """
    if request.content_type == "multipart/form-data":
        return False
    try:
        length = int(request.META["CONTENT_LENGTH"])
    except (KeyError, ValueError):
        return False
    limit: int | None = settings.DATA_UPLOAD_MAX_MEMORY_SIZE  # None in Django, not its stubs
    cap = idempotency_settings.MAX_FINGERPRINTED_BODY
    return length >= 0 and (limit is None or length <= limit) and (cap is None or length <= cap)


def _close_with_request(request: HttpRequest, copy: Any) -> None:
    """Delete the copy when the response is closed, not when the request is collected.

    Django's handlers register ``request.close`` with the response after the
    middleware chain returns; a request kept alive (by a reference cycle, a
    test client's ``wsgi_request``) would otherwise keep the file on disk.
    """
    closes_request = request.close

    def close() -> None:
        copy.close()
        closes_request()

    request.close = close  # type: ignore[method-assign]


class BodyRefused(Exception):
    """A keyed request's body cannot be fingerprinted: refused with ``code`` before the
    key is claimed. ``details`` fill the problem's detail."""

    code = ""

    def __init__(self, **details: int) -> None:
        super().__init__(details)
        self.details = details

    def answer(self, request: HttpRequest) -> HttpResponseBase:
        return problems.refuse(request, self.code, **self.details)

    def refusal(self, request: HttpRequest) -> HttpResponseBase:
        """:meth:`answer`, with the keyed request's one INFO record (``rejected``): for the
        door that sends it, once."""
        return problems.reject(request, self.code, **self.details)


class BodyTooLarge(BodyRefused):
    """A keyed request's body is over ``MAX_FINGERPRINTED_BODY``: nothing of it was read."""

    code = problems.BODY_TOO_LARGE


class BodyCutShort(BodyRefused):
    """Fewer bytes arrived than ``Content-Length`` announced: the client hung up mid-upload.

    Under WSGI the server calls the application once the headers are in, and
    gunicorn (like Django's ``LimitedStream``) hands over what arrived of a
    body cut short without an error. That request was never received whole:
    fingerprinting it, claiming its key and running the view on part of the
    body would keep an answer to a request nobody sent, and the client's
    retry (the whole request) would get ``409 idempotency_key_reused``. It is
    refused before the key is claimed, ``400 idempotency_body_incomplete``,
    which the client, gone, never reads; its retry runs. ASGI servers never
    call the application with a partial body.
    """

    code = problems.BODY_INCOMPLETE


def ready_body(request: HttpRequest, match: ResolverMatch | None) -> BodyRefused | None:
    """For the middleware: ready the body of a keyed request that will be fingerprinted.

    ``match`` is the request's URL match, which the caller resolved (or Django did).

    Nothing is read while ``ENABLED`` is off, nor for a URL that resolves to no
    view or a view exempt from the protection. A body Django keeps in memory
    (:func:`kept_by_django`) is read at once. Any other (multipart, larger, or
    of no stated length) is not copied for a request nobody can be scoped to
    yet (an anonymous one under the default scope): those are answered (401,
    403, a run without protection) without the body being copied. A DRF
    view's token authentication comes later; such a body is readied when the
    key is claimed.
    Returns why a body is refused (over ``MAX_FINGERPRINTED_BODY``, cut short),
    for the caller to answer when it does (:meth:`BodyRefused.refusal`). A
    request it has looked at already (the middleware, then DRF's view) is
    not looked at again.
    """
    settings_ = idempotency_settings
    if getattr(request, READIED_ATTRIBUTE, False) or not settings_.ENABLED:
        return None  # looked at already; or no request is protected: none is read
    setattr(request, READIED_ATTRIBUTE, True)
    view = None if match is None else match.func
    if view is None or getattr(view, EXEMPT_ATTRIBUTE, False):
        return None
    # A body Django keeps in memory is read whoever sent it, as Django's CSRF check
    # reads a form's: asking the session who did would cost more than reading it (a
    # fifth of a keyed request's own work) and add "Vary: Cookie" to the answer.
    if (
        settings_.ANONYMOUS != "session"
        and settings_.SCOPE_FUNCTION is default_scope
        and not kept_by_django(request)
    ):
        user = getattr(request, "user", None)
        anonymous = not getattr(user, "is_authenticated", False) or principal_of(user) is None
        # Unless the view (its class, the method's handler) is under
        # ``@idempotent(scope=...)``: its scope may name an anonymous client.
        view_class = getattr(view, "view_class", None)
        dispatch = getattr(view_class, "dispatch", None)
        handler = getattr(view_class, str(request.method).lower(), None)
        if anonymous and not (
            getattr(getattr(view, OPTIONS_ATTRIBUTE, None), "scope", None)
            or getattr(getattr(dispatch, OPTIONS_ATTRIBUTE, None), "scope", None)
            or getattr(getattr(handler, OPTIONS_ATTRIBUTE, None), "scope", None)
        ):
            return None
    try:
        prepare_body(request)
    except BodyRefused as exc:
        return exc
    return None


def body_chunks(request: HttpRequest) -> Iterator[bytes]:
    """The raw body, without consuming it: ``request.body``, or the copy :func:`prepare_body` made.

    Raises ``RawPostDataException`` when something read the stream first.
    """
    request = django_request_of(request)
    copy = getattr(request, BODY_COPY_ATTRIBUTE, None)
    if copy is None:
        yield request.body
        return
    with open(copy.name, "rb") as body:  # a handle of our own: the view's reads go on
        yield from iter(lambda: body.read(CHUNK_SIZE), b"")


def body_length(request: HttpRequest) -> int:
    """The length of the raw body :func:`body_chunks` reads, without reading it."""
    request = django_request_of(request)
    copy = getattr(request, BODY_COPY_ATTRIBUTE, None)
    return len(request.body) if copy is None else os.fstat(copy.fileno()).st_size


def django_request_of(request: Any) -> HttpRequest:
    # DRF's Request wraps the Django one, whose stream is the one to prepare.
    return getattr(request, "_request", request)  # type: ignore[no-any-return]
