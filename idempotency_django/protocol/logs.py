"""The log line: one structured line per keyed request, task run or webhook delivery.

Written once, at its end, at INFO: its outcome (stored, replayed, refused
with its code, released with its reason). The steps before it (the
reservation, a wait) are DEBUG records; what went wrong on the way is a
WARNING or ERROR record of its own. Never the key, a header value, the path
or the body: the route (the URL pattern that matched), the method, the
request id, and the decision.
Every value goes through :func:`log_value`: a client chooses some of them
(the request id, the method), and one with a space, a quote or a newline
would otherwise add fields of its choosing to the line.
"""

from __future__ import annotations

import json
import logging
import string
import sys
from collections.abc import Mapping
from typing import Any

from django.http import HttpRequest

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.marks import django_request, header
from idempotency_django.protocol.routes import MATCH_ATTRIBUTE, match_of

logger = logging.getLogger("idempotency_django")

#: The most characters of one value a line holds (the request id column's length).
MAX_LOG_VALUE = 255
#: What a value may hold and be written bare: no space, quote, backslash or ``=``,
#: nothing a ``name=value`` parser (logfmt, shlex) splits or unquotes.
_BARE = frozenset(string.ascii_letters + string.digits + "._:/-+@<>*,;()[]{}~!$%&|^?#")


def log(level: int, event: str, request: HttpRequest, **fields: Any) -> None:
    """Log ``event`` for ``request``: ``idempotency event=... method=... route=...``."""
    if not logger.isEnabledFor(level):
        return
    django = getattr(request, "_request", request)
    # Django's own match once it has resolved (the middleware handed its own on).
    match = getattr(django, "resolver_match", None) or getattr(django, MATCH_ATTRIBUTE, None)
    fields = {
        "event": event,
        "method": django.method,
        "route": route_of(django) if match is None else str(match.route),
        "request_id": (request_id(request) or None)
        if idempotency_settings.REQUEST_ID_HEADER
        else None,
        **fields,
    }
    emit(level, fields)


def emit(
    level: int,
    fields: dict[str, Any],
    *,
    to: logging.Logger = logger,
    prefix: str = "idempotency",
    exc_info: bool = False,
) -> None:
    """Write one line, ``{prefix} name=value ...``: the emitter of every line of the library.

    A request's, a task's, a webhook delivery's and the heartbeat's; the fields
    also go to handlers as ``extra["idempotency"]``, for structured logging. The
    ``name=value`` pairs are written out when a handler formats the record, not
    before: a record no handler formats costs no formatting.
    """
    if to.isEnabledFor(level):
        # Every line is written here: the caller ``Logger.log`` would find by walking
        # up the stack (a fifth of a record's cost) is this function, so it is named.
        record = to.makeRecord(
            to.name,
            level,
            __file__,
            _EMIT_LINE,
            f"{prefix} %s",
            (Line(fields),),
            sys.exc_info() if exc_info else None,
            "emit",
            {"idempotency": fields},
        )
        to.handle(record)


#: The line a record names: where :func:`emit` is defined (``Logger.log`` named its call).
_EMIT_LINE = emit.__code__.co_firstlineno


class Line(dict[str, Any]):
    """A line's fields, which read as its ``name=value`` pairs (:func:`log_fields`)."""

    def __str__(self) -> str:
        return log_fields(self)


def error_name(exc: BaseException) -> str:
    """What failed, for a log line: the error a store's ``StoreUnavailable`` wraps, or itself."""
    return type(exc.__cause__ or exc).__name__


def log_fields(fields: Mapping[str, Any]) -> str:
    """``name=value`` pairs for a log line, each value through :func:`log_value`; None left out."""
    pairs = []
    for name, value in fields.items():
        if value is None:
            continue
        text = str(value)
        # log_value's bare case, without a call per field: most values are bare.
        if len(text) > MAX_LOG_VALUE or not text or not _BARE.issuperset(text):
            text = log_value(text)
        pairs.append(f"{name}={text}")
    return " ".join(pairs)


def log_value(value: Any, limit: int = MAX_LOG_VALUE) -> str:
    """``value`` as one field of a log line, whoever chose it.

    Bare when it is made of letters, digits and punctuation that no parser
    splits on (a route, a digest, an error's name); otherwise a JSON string,
    so a space, a quote or ``key=value`` inside it stays inside it, and a
    control or non-ASCII character is an escape. Cut to ``limit`` characters
    first (``...`` marks the cut): a client's header cannot fill the log.
    """
    text = str(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    if text and _BARE.issuperset(text):
        return text
    return json.dumps(text, ensure_ascii=True)


def route_of(request: HttpRequest) -> str:
    """The URL pattern that matched, never the URL: paths can carry ids and tokens."""
    match = match_of(django_request(request))
    return "" if match is None else str(match.route)


def request_id(request: HttpRequest) -> str:
    """The request id header's value, when ``REQUEST_ID_HEADER`` names one."""
    name = idempotency_settings.REQUEST_ID_HEADER
    return (header(request, name) or "")[:255] if name else ""
