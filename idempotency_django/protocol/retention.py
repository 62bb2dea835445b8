"""Which answers are kept for replay: the two tables of ``RETAIN_FUNCTION``.

The two providers' docs differ on client errors; each function is one of
them. A 5xx is never kept, whatever the function says (the attempt decides
that before asking).
"""

from __future__ import annotations

from django.http import HttpRequest
from django.http.response import HttpResponseBase

#: Client errors that stay retryable even with :func:`retain_client_errors`:
#: the request may succeed unchanged after a token exchange, a permission fix,
#: a timeout, a conflict or a rate-limit wait.
NEVER_RETAINED_CLIENT_ERRORS = frozenset({401, 403, 408, 409, 429})


def retain_successes(
    request: HttpRequest, response: HttpResponseBase, exception: Exception | None
) -> bool:
    """The default: keep 2xx/3xx, so a client can fix a 4xx request and retry with its key."""
    return response.status_code < 400


def retain_client_errors(
    request: HttpRequest, response: HttpResponseBase, exception: Exception | None
) -> bool:
    """Keep 4xx too, except 401, 403, 408, 409 and 429 (``NEVER_RETAINED_CLIENT_ERRORS``)."""
    return response.status_code not in NEVER_RETAINED_CLIENT_ERRORS
