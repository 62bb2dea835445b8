"""Call an Idempotency-Key protected API from Python, retrying safely.

One call of :meth:`IdempotentClient.request` (or ``post``, ``put``, ``patch``,
``delete``) is one operation: its key is made once, its body is serialized once,
and every attempt sends the same method, URL, body bytes and key, so a retry after
a lost answer gets the first attempt's stored response instead of doing the work
twice. Which results are retried, and how long to wait, is :func:`decide`: a pure
function of one attempt's outcome, so the retry matrix can be read (and tested)
in one place. The clients around it are thin adapters for ``requests`` and
``httpx``; neither is imported until a session of it is handed over.

Logs (logger ``idempotency_django.client``) name an operation by a short digest
of its key, never by the key, and carry no header values and no body. Neither
they nor the exceptions carry the URL's path or query (a trigger token may be
in it): only the method and the origin.

Redirects are not left to the HTTP library: a ``307`` or ``308`` to the same
origin (scheme, host, port) is followed with the same method, body, key and
headers; any other redirect, and every redirect to another origin, is not
followed (:class:`RequestRejected`), so the body, the key and the credentials
never reach a host they were not sent to.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import logging
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar, overload
from urllib.parse import urljoin, urlsplit

if TYPE_CHECKING:
    import httpx
    import requests
    from typing_extensions import Unpack

__all__ = [
    "AsyncIdempotentClient",
    "Decision",
    "IdempotentClient",
    "IdempotentRequestError",
    "Outcome",
    "RequestOptions",
    "RequestRejected",
    "RetriesExhausted",
    "RetryPolicy",
    "Verdict",
    "decide",
    "parse_retry_after",
]

logger = logging.getLogger(__name__)

# The server's problem codes (idempotency_django.problems); repeated here so that a
# client process does not import Django.
PROBLEM_CONTENT_TYPE = "application/problem+json"
KEY_IN_PROGRESS = "idempotency_key_in_progress"
KEY_REUSED = "idempotency_key_reused"
UNAVAILABLE = "idempotency_unavailable"
#: The server's IGNORED_KEY_HEADER: the key of this request was not used.
IGNORED_KEY_HEADER = "Idempotency-Key-Ignored"

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: requests has no default timeout; an attempt that never ends would make the time
#: budget meaningless. (httpx clients keep their own default.)
REQUESTS_TIMEOUT = 10.0
#: Same-origin 307/308 redirects followed in one attempt, at most.
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class _Response(Protocol):
    """What requests.Response and httpx.Response both offer."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...  # case-insensitive in both
    @property
    def content(self) -> bytes: ...


ResponseT = TypeVar("ResponseT", bound=_Response)


# -- the retry decision ------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try one operation.

    ``attempts`` caps the requests sent (the first included) and ``max_elapsed`` the
    seconds from the first attempt: a wait that would end past it is not taken.
    Between attempts the wait is ``Retry-After`` when the server sent one, otherwise
    exponential backoff with full jitter: a random time in
    ``[0, min(cap, base * 2 ** (attempt - 1)))``, so workers that failed together do
    not retry together.
    """

    attempts: int = 5
    max_elapsed: float = 30.0
    base: float = 0.5
    cap: float = 8.0
    #: Retried besides ``409 idempotency_key_in_progress``: the server either did not
    #: run the request or did not keep its answer (5xx is never stored).
    retry_statuses: frozenset[int] = frozenset({408, 429, 500, 502, 503, 504})

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if min(self.max_elapsed, self.base, self.cap) < 0:
            raise ValueError("max_elapsed, base and cap must not be negative")

    def backoff(self, attempt: int, draw: float) -> float:
        """The wait after ``attempt`` (1-based) failed; ``draw`` is uniform in [0, 1)."""
        ceiling = min(self.cap, self.base * 2.0 ** min(attempt - 1, 64))  # 2**1024 overflows
        return draw * ceiling


@dataclass(frozen=True)
class Outcome:
    """What one attempt came back with.

    ``status`` is None when there was no response at all: the connection failed,
    was dropped or timed out, so the request may or may not have run.
    """

    status: int | None
    code: str | None = None
    retry_after: float | None = None
    #: Why the server did not use the key (its ``Idempotency-Key-Ignored``), if it said so.
    key_ignored: str | None = None


class Verdict(Enum):
    DONE = "done"  # a final answer (2xx, a replay, 3xx): return it
    RETRY = "retry"  # wait, then send the same request with the same key
    REAUTHENTICATE = "reauthenticate"  # 401: exchange the credential, then retry once
    REJECTED = "rejected"  # the same request cannot succeed: fix it or reconcile
    EXHAUSTED = "exhausted"  # retryable, but the attempts or the time budget ran out


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    delay: float = 0.0


def decide(
    outcome: Outcome,
    *,
    attempt: int,
    elapsed: float,
    policy: RetryPolicy,
    draw: float,
    can_reauthenticate: bool = False,
) -> Decision:
    """The client retry matrix, for the ``attempt``-th attempt, ``elapsed`` seconds in.

    ``draw`` (uniform in [0, 1)) is the jitter, passed in so that the decision is
    repeatable. No retry is decided for a 400, 403, 404, 413, 422 or a 409 other
    than in progress (``idempotency_key_reused``): sending the same request again
    would get the same answer, and a new key would hide a real conflict. Nor for
    an answer whose ``Idempotency-Key-Ignored`` says the server did not use the
    key (but a 401, which ran nothing): a retry could run the work twice.
    """
    status = outcome.status
    if status is not None and status < 400:
        return Decision(Verdict.DONE)
    if outcome.key_ignored is not None and status != 401:
        # The server did not use the key: a retry could run the operation twice.
        return Decision(Verdict.REJECTED)
    if status == 401:
        if not can_reauthenticate:
            return Decision(Verdict.REJECTED)
        verdict, delay = Verdict.REAUTHENTICATE, 0.0
    elif (
        status is None
        or status in policy.retry_statuses
        or (status == 409 and outcome.code == KEY_IN_PROGRESS)
    ):
        verdict = Verdict.RETRY
        if outcome.retry_after is not None:
            delay = outcome.retry_after
        else:
            delay = policy.backoff(attempt, draw)
    else:
        return Decision(Verdict.REJECTED)
    # A Retry-After longer than the time left is not shortened: retrying before the
    # server asked would only be refused again.
    if attempt >= policy.attempts or elapsed + delay > policy.max_elapsed:
        return Decision(Verdict.EXHAUSTED)
    return Decision(verdict, delay)


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delay-seconds or an HTTP-date)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, with no claim about the local zone
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


# -- failures ---------------------------------------------------------------------


class IdempotentRequestError(Exception, Generic[ResponseT]):
    """The operation ended without a final answer.

    ``response`` is the last response (None if the last attempt got none); ``code``
    its problem ``code``; ``error`` the network error of the last attempt (None if
    it got a response). Neither the message nor the attributes hold the key, and
    the message holds no URL path or query. ``error`` is not chained as the
    ``__cause__``: its message is the HTTP library's, with the whole URL.
    """

    def __init__(
        self,
        message: str,
        *,
        response: ResponseT | None,
        status: int | None,
        code: str | None,
        attempts: int,
        retry_after: float | None,
        error: Exception | None = None,
    ) -> None:
        super().__init__(message)
        self.error = error
        self.response = response
        self.status = status
        self.code = code
        self.attempts = attempts
        self.retry_after = retry_after


class RequestRejected(IdempotentRequestError[ResponseT]):
    """Sending the same request again cannot help.

    Fix the request (a 4xx), or reconcile a ``409 idempotency_key_reused``: two
    operations share a key. Do not retry it with a fresh key blindly.
    """


class RetriesExhausted(IdempotentRequestError[ResponseT]):
    """Still retryable, but the attempts or the time budget ran out.

    Retry later **with the same key**: if an attempt ran, that is how you get its
    answer. Pass your own ``key=`` if the operation may outlive this call.
    """


# -- one operation ----------------------------------------------------------------


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


class _Timeout(TypedDict, total=False):
    timeout: float | None


class _Operation:
    """One operation: its request, made once, and the count of its attempts."""

    def __init__(
        self,
        method: str,
        url: str,
        options: RequestOptions,
        policy: RetryPolicy,
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
        self.body: bytes | None = options.get("content")
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
        self.timeout: _Timeout = {"timeout": options["timeout"]} if "timeout" in options else {}

        # Logged instead of the URL (whose path, query or userinfo may hold a
        # secret) and the key.
        self.label = f"{self.method} {_origin(url)}"
        self.redirects = 0
        self.digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        self.policy = policy
        self.clock = clock
        self.jitter = jitter
        self.started = clock()
        self.attempt = 0
        self.reauthenticated = False
        self.last = Outcome(None)
        self.elapsed = 0.0

    def judge(
        self, response: _Response | None, error: Exception | None, can_reauthenticate: bool
    ) -> Decision:
        outcome = _outcome(response)
        elapsed = self.clock() - self.started
        decision = decide(
            outcome,
            attempt=self.attempt,
            elapsed=elapsed,
            policy=self.policy,
            draw=self.jitter(),
            can_reauthenticate=can_reauthenticate and not self.reauthenticated,
        )
        self.last, self.elapsed = outcome, elapsed
        verdict = decision.verdict
        level, then = {
            Verdict.DONE: (logging.DEBUG, "done"),
            Verdict.RETRY: (logging.INFO, f"retrying in {decision.delay:.2f} s"),
            Verdict.REAUTHENTICATE: (logging.INFO, "exchanging the credential, retrying once"),
            Verdict.REJECTED: (logging.WARNING, "not retried"),
            Verdict.EXHAUSTED: (logging.WARNING, "out of attempts or time"),
        }[verdict]
        result = _describe(outcome, response, error)
        logger.log(
            level,
            "%s [op %s] attempt %d: %s; %s",
            self.label,
            self.digest,
            self.attempt,
            result,
            then,
        )
        if verdict is Verdict.REAUTHENTICATE:
            self.reauthenticated = True
        return decision

    def redirect(self, response: _Response) -> bool:
        """Whether ``response`` is a redirect to follow (the URL is then its target).

        Raises :class:`RequestRejected` for a redirect that is not followed.
        """
        if response.status_code not in REDIRECTS:
            return False
        location = response.headers.get("Location")
        if not location:
            return False
        target = urljoin(self.url, location)
        same_origin = _origin(target) == _origin(self.url)
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

    def failure(
        self, decision: Decision, response: ResponseT | None, error: Exception | None
    ) -> IdempotentRequestError[ResponseT]:
        outcome = self.last
        result = _describe(outcome, None, error)
        attempts = f"{self.attempt} attempt{'s' if self.attempt > 1 else ''}"
        kind: type[IdempotentRequestError[ResponseT]]
        if decision.verdict is Verdict.REJECTED:
            kind, advice = RequestRejected, "sending it again unchanged cannot help"
        else:
            kind, advice = RetriesExhausted, "retry later with the same key"
        message = f"{self.label}: {result} after {attempts} in {self.elapsed:.1f} s; {advice}"
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


def _outcome(response: _Response | None) -> Outcome:
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


def _describe(outcome: Outcome, response: _Response | None, error: Exception | None) -> str:
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


# -- the clients ------------------------------------------------------------------


@dataclass(frozen=True)
class _NetworkErrors:
    """Which of a library's exceptions mean "sent, or maybe sent, without an answer"."""

    caught: tuple[type[Exception], ...]
    retried: tuple[type[Exception], ...]
    not_retried: tuple[type[Exception], ...] = ()

    def retryable(self, error: Exception) -> bool:
        return isinstance(error, self.retried) and not isinstance(error, self.not_retried)


def _requests_errors() -> _NetworkErrors:
    import requests

    return _NetworkErrors(
        caught=(requests.RequestException,),
        retried=(
            requests.ConnectionError,
            requests.Timeout,
            requests.exceptions.ChunkedEncodingError,  # the answer broke off
        ),
        # SSLError is a ConnectionError, but a certificate problem is not a blip.
        not_retried=(requests.exceptions.SSLError,),
    )


def _httpx_errors() -> _NetworkErrors:
    import httpx

    return _NetworkErrors(
        caught=(httpx.TransportError,),
        retried=(
            httpx.TimeoutException,
            httpx.NetworkError,
            httpx.RemoteProtocolError,  # e.g. the server closed without answering
        ),
    )


class _Sender(Protocol[ResponseT]):
    errors: _NetworkErrors

    def send(self, operation: _Operation) -> ResponseT: ...
    def close(self, response: ResponseT) -> None: ...


class _RequestsSender:
    def __init__(self, session: requests.Session) -> None:
        self.session = session
        self.errors = _requests_errors()

    def send(self, operation: _Operation) -> requests.Response:
        return self.session.request(
            operation.method,
            operation.url,
            data=operation.body,
            headers=operation.headers,
            timeout=operation.timeout.get("timeout", REQUESTS_TIMEOUT),
            allow_redirects=False,
        )

    def close(self, response: requests.Response) -> None:
        response.close()


class _HttpxSender:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.errors = _httpx_errors()

    def send(self, operation: _Operation) -> httpx.Response:
        return self.client.request(
            operation.method,
            operation.url,
            content=operation.body,
            headers=operation.headers,
            follow_redirects=False,
            **operation.timeout,
        )

    def close(self, response: httpx.Response) -> None:
        response.close()


def _sender_for(session: object) -> _Sender[Any]:
    # The library the session comes from is already imported; the other may not be
    # installed at all.
    requests_module = sys.modules.get("requests")
    if requests_module is not None and isinstance(session, requests_module.Session):
        return _RequestsSender(session)
    httpx_module = sys.modules.get("httpx")
    if httpx_module is not None and isinstance(session, httpx_module.Client):
        return _HttpxSender(session)
    if httpx_module is not None and isinstance(session, httpx_module.AsyncClient):
        raise TypeError("an httpx.AsyncClient goes with AsyncIdempotentClient")
    raise TypeError(f"expected a requests.Session or an httpx.Client, not {type(session).__name__}")


class IdempotentClient(Generic[ResponseT]):
    """Unsafe requests through a ``requests.Session`` or an ``httpx.Client``, retried safely.

    Each call is one operation and returns its final response (a success, or the
    replay of one). A response that retrying cannot change raises
    :class:`RequestRejected`; running out of attempts or time raises
    :class:`RetriesExhausted`. Authentication, cookies and default headers stay the
    session's. ``reauthenticate``, if given, is called once per operation on a 401
    and returns the headers (e.g. ``Authorization``) to retry with.

    ``clock``, ``sleep`` and ``jitter`` (uniform in [0, 1)) are there for tests.
    """

    @overload
    def __init__(
        self: IdempotentClient[requests.Response],
        session: requests.Session,
        *,
        policy: RetryPolicy | None = None,
        reauthenticate: Callable[[], Mapping[str, str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None: ...
    @overload
    def __init__(
        self: IdempotentClient[httpx.Response],
        session: httpx.Client,
        *,
        policy: RetryPolicy | None = None,
        reauthenticate: Callable[[], Mapping[str, str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None: ...
    def __init__(
        self,
        session: requests.Session | httpx.Client,
        *,
        policy: RetryPolicy | None = None,
        reauthenticate: Callable[[], Mapping[str, str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._sender: _Sender[ResponseT] = _sender_for(session)
        self.policy = policy or RetryPolicy()
        self._reauthenticate = reauthenticate
        self._clock, self._sleep, self._jitter = clock, sleep, jitter

    def request(self, method: str, url: str, **options: Unpack[RequestOptions]) -> ResponseT:
        """Send ``method url`` as one operation; see :class:`RequestOptions`."""
        operation = _Operation(method, url, options, self.policy, self._clock, self._jitter)
        sender = self._sender
        while True:
            operation.attempt += 1
            response: ResponseT | None = None
            error: Exception | None = None
            try:
                response = sender.send(operation)
            except sender.errors.caught as caught:
                if not sender.errors.retryable(caught):
                    raise
                error = caught
            if response is not None and operation.redirect(response):
                sender.close(response)
                operation.attempt -= 1  # the same attempt, at the redirect's target
                continue
            decision = operation.judge(response, error, self._reauthenticate is not None)
            if decision.verdict is Verdict.DONE:
                assert response is not None
                return response
            if decision.verdict in (Verdict.REJECTED, Verdict.EXHAUSTED):
                # Not chained: the library's error message holds the whole URL.
                raise operation.failure(decision, response, error) from None
            if response is not None:
                sender.close(response)
            if decision.verdict is Verdict.REAUTHENTICATE:
                assert self._reauthenticate is not None
                operation.headers.update(self._reauthenticate())
            self._sleep(decision.delay)

    def post(self, url: str, **options: Unpack[RequestOptions]) -> ResponseT:
        return self.request("POST", url, **options)

    def put(self, url: str, **options: Unpack[RequestOptions]) -> ResponseT:
        return self.request("PUT", url, **options)

    def patch(self, url: str, **options: Unpack[RequestOptions]) -> ResponseT:
        return self.request("PATCH", url, **options)

    def delete(self, url: str, **options: Unpack[RequestOptions]) -> ResponseT:
        return self.request("DELETE", url, **options)


class AsyncIdempotentClient:
    """:class:`IdempotentClient` for an ``httpx.AsyncClient``."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        policy: RetryPolicy | None = None,
        reauthenticate: Callable[[], Awaitable[Mapping[str, str]]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._client = client
        self._errors = _httpx_errors()
        self.policy = policy or RetryPolicy()
        self._reauthenticate = reauthenticate
        self._clock, self._sleep, self._jitter = clock, sleep, jitter

    async def request(
        self, method: str, url: str, **options: Unpack[RequestOptions]
    ) -> httpx.Response:
        """Send ``method url`` as one operation; see :class:`RequestOptions`."""
        operation = _Operation(method, url, options, self.policy, self._clock, self._jitter)
        while True:
            operation.attempt += 1
            response: httpx.Response | None = None
            error: Exception | None = None
            try:
                response = await self._client.request(
                    operation.method,
                    operation.url,
                    content=operation.body,
                    headers=operation.headers,
                    follow_redirects=False,
                    **operation.timeout,
                )
            except self._errors.caught as caught:
                if not self._errors.retryable(caught):
                    raise
                error = caught
            if response is not None and operation.redirect(response):
                await response.aclose()
                operation.attempt -= 1  # the same attempt, at the redirect's target
                continue
            decision = operation.judge(response, error, self._reauthenticate is not None)
            if decision.verdict is Verdict.DONE:
                assert response is not None
                return response
            if decision.verdict in (Verdict.REJECTED, Verdict.EXHAUSTED):
                # Not chained: the library's error message holds the whole URL.
                raise operation.failure(decision, response, error) from None
            if response is not None:
                await response.aclose()
            if decision.verdict is Verdict.REAUTHENTICATE:
                assert self._reauthenticate is not None
                operation.headers.update(await self._reauthenticate())
            await self._sleep(decision.delay)

    async def post(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("POST", url, **options)

    async def put(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("PUT", url, **options)

    async def patch(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("PATCH", url, **options)

    async def delete(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("DELETE", url, **options)
