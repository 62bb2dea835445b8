"""Call an Idempotency-Key protected API from Python, retrying safely.

One call of :meth:`IdempotentClient.request` (or ``post``, ``put``, ``patch``,
``delete``) is one operation: its key is made once, its body is serialized once,
and every attempt sends the same method, URL, body bytes and key, so a retry after
a lost answer gets the first attempt's stored response instead of doing the work
twice. Which results are retried, and how long to wait, is :func:`decide`: a pure
function of one attempt's outcome, so the retry matrix can be read (and tested)
in one place.

The modules, one job each: ``policy`` (the decision), ``operation`` (one operation's
request and the state of its attempts, which says after each attempt what comes
next), ``errors`` (how an operation fails) and ``clients`` (the one retry loop, and
the thin sync and async clients that carry out its steps with a ``requests`` or
``httpx`` session; neither library is imported until a session of it is handed
over). Nothing here imports Django.
"""

from idempotency_client.clients import AsyncIdempotentClient, IdempotentClient
from idempotency_client.errors import IdempotentRequestError, RequestRejected, RetriesExhausted
from idempotency_client.operation import (
    MAX_REDIRECTS,
    REQUESTS_TIMEOUT,
    MultipartValue,
    RequestOptions,
    multipart_body,
)
from idempotency_client.policy import (
    IGNORED_KEY_HEADER,
    KEY_IN_PROGRESS,
    KEY_REUSED,
    PROBLEM_CONTENT_TYPE,
    UNAVAILABLE,
    Decision,
    Outcome,
    RetryPolicy,
    Verdict,
    decide,
    parse_retry_after,
)

#: The one place the version is written (pyproject.toml reads it); it moves with
#: idempotency-django's.
__version__ = "0.3.0.dev0"

__all__ = [
    "IGNORED_KEY_HEADER",
    "KEY_IN_PROGRESS",
    "KEY_REUSED",
    "MAX_REDIRECTS",
    "PROBLEM_CONTENT_TYPE",
    "REQUESTS_TIMEOUT",
    "UNAVAILABLE",
    "AsyncIdempotentClient",
    "Decision",
    "IdempotentClient",
    "IdempotentRequestError",
    "MultipartValue",
    "Outcome",
    "RequestOptions",
    "RequestRejected",
    "RetriesExhausted",
    "RetryPolicy",
    "Verdict",
    "__version__",
    "decide",
    "multipart_body",
    "parse_retry_after",
]
