"""One operation: its request, made once, and what comes after each of its attempts.

:meth:`Operation.after` is the retry loop's every decision (follow a redirect, wait
and retry, exchange the credential, return, raise), so the loop (in ``clients``)
only sends, closes, sleeps and asks it again.

Logs (logger ``idempotency_client``) name an operation by a short digest of its
key, never by the key, and carry no header values and no body. Neither they nor
the exceptions carry the URL's path or query (a trigger token may be in it): only
the method and the origin.

Redirects are not left to the HTTP library: a ``307`` or ``308`` to the same origin
(scheme, host, port) is followed with the same method, body, key and headers; any
other redirect, and every redirect to another origin, is not followed
(:class:`RequestRejected`), so the body, the key and the credentials never reach a
host they were not sent to.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypedDict, TypeVar
from urllib.parse import urljoin, urlsplit

from idempotency_client.errors import IdempotentRequestError, RequestRejected, RetriesExhausted
from idempotency_client.policy import (
    IGNORED_KEY_HEADER,
    PROBLEM_CONTENT_TYPE,
    Decision,
    Outcome,
    RetryPolicy,
    Verdict,
    decide,
    parse_retry_after,
)

logger = logging.getLogger("idempotency_client")

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: requests has no default timeout; an attempt that never ends would make the time
#: budget meaningless. (httpx clients keep their own default.)
REQUESTS_TIMEOUT = 10.0
#: Same-origin 307/308 redirects followed in one attempt, at most.
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class Response(Protocol):
    """What requests.Response and httpx.Response both offer."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...  # case-insensitive in both
    @property
    def content(self) -> bytes: ...


ResponseT = TypeVar("ResponseT", bound=Response)

#: A multipart/form-data field: a value, or a file as (filename, content[, content type]).
MultipartValue = str | tuple[str, bytes] | tuple[str, bytes, str]


def multipart_body(fields: Mapping[str, MultipartValue], boundary: str) -> bytes:
    """``fields`` as a multipart/form-data body (RFC 7578) with ``boundary``."""

    def quoted(value: str) -> str:  # as browsers escape names and filenames (WHATWG)
        return value.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")

    parts: list[bytes] = []
    for name, value in fields.items():
        disposition = f'form-data; name="{quoted(name)}"'
        if isinstance(value, str):
            head, content = f"Content-Disposition: {disposition}\r\n", value.encode()
        else:
            filename, content = value[0], value[1]
            kind = value[2] if len(value) == 3 else "application/octet-stream"
            head = (
                f'Content-Disposition: {disposition}; filename="{quoted(filename)}"\r\n'
                f"Content-Type: {kind}\r\n"
            )
        parts.append(f"--{boundary}\r\n{head}\r\n".encode() + content + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


class RequestOptions(TypedDict, total=False):
    """What a request may carry besides its method and URL.

    ``json`` (any JSON value), ``content`` (bytes) or ``multipart`` (form fields: a
    str, or a file as ``(filename, bytes)`` or ``(filename, bytes, content type)``):
    the body, serialized once, so every attempt sends the same bytes (one multipart
    boundary per operation).
    ``headers``: extra headers (the session's own are sent as usual).
    ``key``: the Idempotency-Key; one is made (a UUID4) if not given.
    ``location``: sent as ``X-Location-Id``.
    ``timeout``: seconds for each attempt; None for none. By default the httpx
    client's own timeout, and 10 seconds with requests.
    """

    json: Any
    content: bytes
    multipart: Mapping[str, MultipartValue]
    headers: Mapping[str, str]
    key: str
    location: str
    timeout: float | None


class Timeout(TypedDict, total=False):
    timeout: float | None


@dataclass(frozen=True)
class Next:
    """What the loop does before it sends the operation again.

    ``wait``: seconds to sleep first (None: at once, the same attempt at a
    redirect's target). ``reauthenticate``: update the headers with fresh ones first.
    """

    wait: float | None = None
    reauthenticate: bool = False


#: The log level of each verdict, and what the line says comes next.
_LOGGED = {
    Verdict.DONE: (logging.DEBUG, "done"),
    Verdict.RETRY: (logging.INFO, "retrying in {delay:.2f} s"),
    Verdict.REAUTHENTICATE: (logging.INFO, "exchanging the credential, retrying once"),
    Verdict.REJECTED: (logging.WARNING, "not retried"),
    Verdict.EXHAUSTED: (logging.WARNING, "out of attempts or time"),
}


class Operation:
    """One operation: its request, made once, and the state of its attempts."""

    def __init__(
        self,
        method: str,
        url: str,
        options: RequestOptions,
        policy: RetryPolicy,
        *,
        can_reauthenticate: bool,
        clock: Callable[[], float],
        jitter: Callable[[], float],
    ) -> None:
        self.method = method.upper()
        if self.method not in UNSAFE_METHODS:
            raise ValueError(f"{method} is not an unsafe method: it needs no Idempotency-Key")
        if len({"json", "content", "multipart"} & set(options)) > 1:
            raise ValueError("pass one of json=, content= and multipart=, not both")
        self.headers = dict(options.get("headers") or {})
        given = {name.lower() for name in self.headers}
        if "idempotency-key" in given:
            raise ValueError("pass the Idempotency-Key as key=, not in headers")
        key = options.get("key", None)
        if key is None:
            key = str(uuid.uuid4())  # once per operation, never per attempt
        elif not key:
            raise ValueError("the key must not be empty")
        self.headers["Idempotency-Key"] = key
        if "location" in options:
            if "x-location-id" in given:
                raise ValueError("pass the location as location= or in headers, not both")
            self.headers["X-Location-Id"] = options["location"]
        content = options.get("content")
        if content is not None and not isinstance(content, bytes | bytearray | memoryview):
            # A stream or a generator is read by the first attempt: a retry would send
            # an empty or partial body under the same key.
            raise TypeError("content= takes bytes: read a stream into bytes first")
        self.body: bytes | None = None if content is None else bytes(content)
        if "json" in options:
            self.body = json.dumps(
                options["json"], separators=(",", ":"), ensure_ascii=False, allow_nan=False
            ).encode()
            if "content-type" not in given:
                self.headers["Content-Type"] = "application/json"
        if "multipart" in options:
            if "content-type" in given:
                raise ValueError("multipart= sets the Content-Type (its boundary) itself")
            boundary = uuid.uuid4().hex  # once per operation: every attempt, the same bytes
            self.body = multipart_body(options["multipart"], boundary)
            self.headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        self.url = url
        self.timeout: Timeout = {"timeout": options["timeout"]} if "timeout" in options else {}

        # Logged instead of the URL (whose path, query or userinfo may hold a
        # secret) and the key.
        self.label = f"{self.method} {_origin(url)}"
        self.digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        self.policy = policy
        self.can_reauthenticate = can_reauthenticate
        self.clock = clock
        self.jitter = jitter
        self.started = clock()
        self.attempt = 1  # the attempt in flight; a followed redirect is part of it
        #: The attempts before it whose answer was not "in progress": those that may have
        #: run, which ``policy.attempts`` caps.
        self.counted = 0
        self.redirects = 0

    def after(self, response: ResponseT | None, error: Exception | None) -> Next | None:
        """What comes after the attempt that got ``response`` (or the network ``error``).

        None: ``response`` is the final answer. Raises :class:`RequestRejected` or
        :class:`RetriesExhausted` when the operation ends without one.
        """
        if response is not None and self._follows(response):
            return Next()
        outcome = _outcome(response)
        elapsed = self.clock() - self.started
        decision = decide(
            outcome,
            attempt=self.attempt,
            counted=self.counted + (not outcome.in_progress),
            elapsed=elapsed,
            policy=self.policy,
            draw=self.jitter(),
            can_reauthenticate=self.can_reauthenticate,
        )
        level, then = _LOGGED[decision.verdict]
        logger.log(
            level,
            "%s [op %s] attempt %d: %s; %s",
            self.label,
            self.digest,
            self.attempt,
            _describe(outcome, response, error),
            then.format(delay=decision.delay),
        )
        if decision.verdict is Verdict.DONE:
            return None
        if decision.verdict in (Verdict.REJECTED, Verdict.EXHAUSTED):
            # Not chained: the library's error message holds the whole URL.
            raise self._failure(decision, outcome, elapsed, response, error) from None
        self.attempt += 1
        self.counted += not outcome.in_progress
        if decision.verdict is Verdict.REAUTHENTICATE:
            self.can_reauthenticate = False  # once per operation
            return Next(decision.delay, reauthenticate=True)
        return Next(decision.delay)

    def _follows(self, response: Response) -> bool:
        """Whether ``response`` is a redirect to follow (the URL is then its target).

        Raises :class:`RequestRejected` for a redirect that is not followed.
        """
        if response.status_code not in REDIRECTS:
            return False
        location = response.headers.get("Location")
        if not location:
            return False
        target = urljoin(self.url, location)
        same_origin = _unambiguous(location, target) and _origin(target) == _origin(self.url)
        if same_origin and response.status_code in (307, 308) and self.redirects < MAX_REDIRECTS:
            self.redirects += 1
            logger.debug("%s [op %s] following a %d", self.label, self.digest, response.status_code)
            self.url = target
            return True
        reason = "to another origin" if not same_origin else "that would change the request"
        if same_origin and response.status_code in (307, 308):
            reason = f"past {MAX_REDIRECTS} redirects"
        message = (
            f"{self.label}: {response.status_code} redirect {reason} ({_origin(target)}), "
            "not followed: the body, the key and the credentials were not sent there"
        )
        logger.warning("%s [op %s] attempt %d: %s", self.label, self.digest, self.attempt, message)
        raise RequestRejected(
            message,
            response=response,
            status=response.status_code,
            code=None,
            attempts=self.attempt,
            retry_after=None,
        )

    def not_retried(self, error: Exception) -> IdempotentRequestError[Any]:
        """A network error that retrying cannot help (a certificate refused): a
        :class:`RequestRejected`, as every answer not retried, without the library's
        message, which holds the URL with its path and query."""
        failure: IdempotentRequestError[Any] = self._failure(
            Decision(Verdict.REJECTED), Outcome(None), self.clock() - self.started, None, error
        )
        logger.warning("%s [op %s] %s", self.label, self.digest, failure)
        return failure

    def _failure(
        self,
        decision: Decision,
        outcome: Outcome,
        elapsed: float,
        response: ResponseT | None,
        error: Exception | None,
    ) -> IdempotentRequestError[ResponseT]:
        result = _describe(outcome, None, error)
        attempts = f"{self.attempt} attempt{'s' if self.attempt > 1 else ''}"
        kind: type[IdempotentRequestError[ResponseT]]
        if decision.verdict is Verdict.REJECTED:
            kind, advice = RequestRejected, "sending it again unchanged cannot help"
        else:
            kind, advice = RetriesExhausted, "retry later with the same key"
        message = f"{self.label}: {result} after {attempts} in {elapsed:.1f} s; {advice}"
        if outcome.retry_after is not None:
            message += f" (Retry-After: {outcome.retry_after:g} s)"
        return kind(
            message,
            response=response,
            status=outcome.status,
            code=outcome.code,
            attempts=self.attempt,
            retry_after=outcome.retry_after,
            error=error,
        )


def _unambiguous(location: str, target: str) -> bool:
    """Whether every HTTP library reads the host of ``location`` (resolved: ``target``)
    as :func:`_origin` does.

    URL parsers differ on a backslash (urllib.parse takes it for part of the userinfo,
    urllib3 for the end of the host), on whitespace and control characters (some drop
    them), on userinfo, and on a port that is not plain ASCII digits (``+8443``,
    ``8_443``: urllib.parse refuses it and :func:`_origin` would drop it, httpx reads
    8443): a redirect holding any of them is not followed.
    """
    if "\\" in location or not location.isprintable() or any(c.isspace() for c in location):
        return False
    given = urlsplit(location)
    if given.username is not None or given.password is not None:
        return False
    try:
        urlsplit(target).port  # noqa: B018  # raises for a port of more than ASCII digits
    except ValueError:
        return False
    return True


def _origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: no userinfo, path, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def _outcome(response: Response | None) -> Outcome:
    if response is None:
        return Outcome(None)
    code = None
    content_type = response.headers.get("Content-Type", "")
    if content_type.split(";")[0].strip().lower() == PROBLEM_CONTENT_TYPE:
        try:
            problem = json.loads(response.content)
        except ValueError:
            problem = None
        if isinstance(problem, dict) and isinstance(problem.get("code"), str):
            code = problem["code"]
    retry_after = parse_retry_after(response.headers.get("Retry-After"), datetime.now(UTC))
    key_ignored = response.headers.get(IGNORED_KEY_HEADER)
    return Outcome(response.status_code, code, retry_after, key_ignored)


def _describe(outcome: Outcome, response: Response | None, error: Exception | None) -> str:
    """The result of an attempt for a log line or a message: status, code, no secrets."""
    if outcome.status is None:
        # The exception's type only: its message may carry the URL with its query.
        return f"no response ({type(error).__name__})"
    parts = [str(outcome.status)]
    if outcome.code:
        parts.append(outcome.code)
    if response is not None:
        if response.headers.get("Idempotency-Replayed") == "true":
            parts.append("replayed")
        if outcome.key_ignored is not None:
            parts.append(f"key ignored by the server ({outcome.key_ignored[:32]})")
        request_id = response.headers.get("X-Request-Id")
        if request_id:
            parts.append(f"(X-Request-Id {request_id[:64]})")
    return " ".join(parts)
