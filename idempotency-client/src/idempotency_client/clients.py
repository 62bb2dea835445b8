"""The clients: a ``requests`` or ``httpx`` session, sync or async, around one retry loop.

The loop is written once, :meth:`_Retrying._retry_loop`: a generator that yields each
step (send, close a response that is not returned, exchange the credential, sleep)
for the sync or the async client to carry out the way its library does. Every
decision in it is :meth:`Operation.after`'s.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, overload

from idempotency_client.operation import REQUESTS_TIMEOUT, Operation, RequestOptions, ResponseT
from idempotency_client.policy import RetryPolicy

if TYPE_CHECKING:
    import httpx
    import requests
    from typing_extensions import Unpack


@dataclass(frozen=True)
class _NetworkErrors:
    """Which of a library's exceptions mean "sent, or maybe sent, without an answer"."""

    caught: tuple[type[Exception], ...]
    retried: tuple[type[Exception], ...]
    not_retried: tuple[type[Exception], ...] = ()

    def retryable(self, error: Exception) -> bool:
        if not isinstance(error, self.retried) or isinstance(error, self.not_retried):
            return False
        # A certificate or TLS failure is not a blip, whichever library reports it (httpx
        # as a ConnectError whose cause is the ssl module's error).
        cause: BaseException | None = error
        while cause is not None:
            if isinstance(cause, ssl.SSLError):
                return False
            cause = cause.__cause__ or cause.__context__
        return True


def replace_headers(headers: dict[str, str], fresh: Mapping[str, str]) -> None:
    """``headers`` with ``fresh`` in place of the headers of the same names, in any case."""
    names = {name.lower() for name in fresh}
    for name in [name for name in headers if name.lower() in names]:
        del headers[name]
    headers.update(fresh)


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
    def send(self, operation: Operation) -> ResponseT: ...
    def close(self, response: ResponseT) -> None: ...


class _RequestsSender:
    def __init__(self, session: requests.Session) -> None:
        self.session = session

    def send(self, operation: Operation) -> requests.Response:
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


def _httpx_arguments(operation: Operation) -> dict[str, Any]:
    """The arguments of ``request`` for an ``httpx.Client`` or ``httpx.AsyncClient``."""
    return {
        "method": operation.method,
        "url": operation.url,
        "content": operation.body,
        "headers": operation.headers,
        "follow_redirects": False,
        **operation.timeout,
    }


class _HttpxSender:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def send(self, operation: Operation) -> httpx.Response:
        return self.client.request(**_httpx_arguments(operation))

    def close(self, response: httpx.Response) -> None:
        response.close()


def _sender_for(session: object) -> tuple[_Sender[Any], _NetworkErrors]:
    # The library the session comes from is already imported; the other may not be
    # installed at all.
    requests_module = sys.modules.get("requests")
    if requests_module is not None and isinstance(session, requests_module.Session):
        return _RequestsSender(session), _requests_errors()
    httpx_module = sys.modules.get("httpx")
    if httpx_module is not None and isinstance(session, httpx_module.Client):
        return _HttpxSender(session), _httpx_errors()
    if httpx_module is not None and isinstance(session, httpx_module.AsyncClient):
        raise TypeError("an httpx.AsyncClient goes with AsyncIdempotentClient")
    raise TypeError(f"expected a requests.Session or an httpx.Client, not {type(session).__name__}")


# The steps the retry loop yields, for a client to carry out.


@dataclass(frozen=True)
class _Send:
    """Send ``operation`` as it now is; the answer is the response, or the network error."""

    operation: Operation


@dataclass(frozen=True)
class _Close(Generic[ResponseT]):
    """Close a response that is not returned (nobody else will)."""

    response: ResponseT


@dataclass(frozen=True)
class _Reauthenticate:
    """Update ``headers`` with the ``reauthenticate`` callback's."""

    headers: dict[str, str]


@dataclass(frozen=True)
class _Sleep:
    seconds: float


class _Retrying(Generic[ResponseT]):
    """What the sync and the async client share: the policy and the one retry loop."""

    def __init__(
        self,
        errors: _NetworkErrors,
        policy: RetryPolicy | None,
        *,
        can_reauthenticate: bool,
        clock: Callable[[], float],
        jitter: Callable[[], float],
    ) -> None:
        self._errors = errors
        self.policy = policy or RetryPolicy()
        self._can_reauthenticate = can_reauthenticate
        self._clock, self._jitter = clock, jitter

    def _retry_loop(
        self, method: str, url: str, options: RequestOptions
    ) -> Generator[
        _Send | _Close[ResponseT] | _Reauthenticate | _Sleep,
        ResponseT | Exception | None,
        ResponseT,
    ]:
        """The steps of one operation, each to carry out; its value is the final response.

        After a :class:`_Send` it is sent the response or the network error (None after
        the other steps).
        """
        operation = Operation(
            method,
            url,
            options,
            self.policy,
            can_reauthenticate=self._can_reauthenticate,
            clock=self._clock,
            jitter=self._jitter,
        )
        while True:
            answer = yield _Send(operation)
            if isinstance(answer, Exception):
                if not self._errors.retryable(answer):
                    raise operation.not_retried(answer) from None
                response, error = None, answer
            else:
                response, error = answer, None
            then = operation.after(response, error)
            if then is None:
                assert response is not None
                return response
            if response is not None:
                yield _Close(response)
            if then.reauthenticate:
                yield _Reauthenticate(operation.headers)
            if then.wait is not None:
                yield _Sleep(then.wait)


class IdempotentClient(_Retrying[ResponseT]):
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
        sender, errors = _sender_for(session)
        super().__init__(
            errors,
            policy,
            can_reauthenticate=reauthenticate is not None,
            clock=clock,
            jitter=jitter,
        )
        self._sender: _Sender[ResponseT] = sender
        self._reauthenticate, self._sleep = reauthenticate, sleep

    def request(self, method: str, url: str, **options: Unpack[RequestOptions]) -> ResponseT:
        """Send ``method url`` as one operation; see :class:`RequestOptions`."""
        steps = self._retry_loop(method, url, options)
        answer: ResponseT | Exception | None = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                final: ResponseT = done.value
                return final
            answer = None
            if isinstance(step, _Send):
                try:
                    answer = self._sender.send(step.operation)
                except self._errors.caught as error:
                    answer = error
            elif isinstance(step, _Close):
                self._sender.close(step.response)
            elif isinstance(step, _Reauthenticate):
                assert self._reauthenticate is not None
                replace_headers(step.headers, self._reauthenticate())
            else:
                self._sleep(step.seconds)

    def post(self, url: str, **options: Unpack[RequestOptions]) -> ResponseT:
        return self.request("POST", url, **options)

    def put(self, url: str, **options: Unpack[RequestOptions]) -> ResponseT:
        return self.request("PUT", url, **options)

    def patch(self, url: str, **options: Unpack[RequestOptions]) -> ResponseT:
        return self.request("PATCH", url, **options)

    def delete(self, url: str, **options: Unpack[RequestOptions]) -> ResponseT:
        return self.request("DELETE", url, **options)


class AsyncIdempotentClient(_Retrying["httpx.Response"]):
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
        super().__init__(
            _httpx_errors(),
            policy,
            can_reauthenticate=reauthenticate is not None,
            clock=clock,
            jitter=jitter,
        )
        self._client = client
        self._reauthenticate, self._sleep = reauthenticate, sleep

    async def request(
        self, method: str, url: str, **options: Unpack[RequestOptions]
    ) -> httpx.Response:
        """Send ``method url`` as one operation; see :class:`RequestOptions`."""
        steps = self._retry_loop(method, url, options)
        answer: httpx.Response | Exception | None = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                final: httpx.Response = done.value
                return final
            answer = None
            if isinstance(step, _Send):
                try:
                    answer = await self._client.request(**_httpx_arguments(step.operation))
                except self._errors.caught as error:
                    answer = error
            elif isinstance(step, _Close):
                await step.response.aclose()
            elif isinstance(step, _Reauthenticate):
                assert self._reauthenticate is not None
                replace_headers(step.headers, await self._reauthenticate())
            else:
                await self._sleep(step.seconds)

    async def post(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("POST", url, **options)

    async def put(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("PUT", url, **options)

    async def patch(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("PATCH", url, **options)

    async def delete(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("DELETE", url, **options)
