"""The log line: one structured line per decision of the library.

Never the key, a header value, the path or the body: the route (the URL
pattern that matched), the method, the request id, and the decision.
"""

from __future__ import annotations

import logging
from typing import Any

from django.http import HttpRequest

from idempotency_django.conf import header, idempotency_settings
from idempotency_django.marks import django_request
from idempotency_django.routes import match_of

logger = logging.getLogger("idempotency_django")


def log(level: int, event: str, request: HttpRequest, **fields: Any) -> None:
    """Log ``event`` for ``request``: ``idempotency event=... method=... route=...``."""
    if not logger.isEnabledFor(level):
        return
    fields = {
        "event": event,
        "method": request.method,
        "route": route_of(request),
        "request_id": request_id(request) or None,
        **fields,
    }
    line = " ".join(f"{name}={value}" for name, value in fields.items() if value is not None)
    logger.log(level, "idempotency %s", line, extra={"idempotency": fields})


def route_of(request: HttpRequest) -> str:
    """The URL pattern that matched, never the URL: paths can carry ids and tokens."""
    match = match_of(django_request(request))
    return "" if match is None else str(match.route)


def request_id(request: HttpRequest) -> str:
    """The request id header's value, when ``REQUEST_ID_HEADER`` names one."""
    name = idempotency_settings.REQUEST_ID_HEADER
    return (header(request, name) or "")[:255] if name else ""
