"""The clients: a ``requests`` or ``httpx`` session, sync or async, around one retry loop.

Every decision of the loop is :meth:`Operation.after`'s; the sync and the async
loop only send an attempt, close a response that is not returned, exchange the
credential and sleep, each the way its library does.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
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


class _HttpxSender:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def send(self, operation: Operation) -> httpx.Response:
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
        sender, self._errors = _sender_for(session)
        self._sender: _Sender[ResponseT] = sender
        self.policy = policy or RetryPolicy()
        self._reauthenticate = reauthenticate
        self._clock, self._sleep, self._jitter = clock, sleep, jitter

    def request(self, method: str, url: str, **options: Unpack[RequestOptions]) -> ResponseT:
        """Send ``method url`` as one operation; see :class:`RequestOptions`."""
        operation = Operation(
            method,
            url,
            options,
            self.policy,
            can_reauthenticate=self._reauthenticate is not None,
            clock=self._clock,
            jitter=self._jitter,
        )
        while True:
            response: ResponseT | None = None
            error: Exception | None = None
            try:
                response = self._sender.send(operation)
            except self._errors.caught as caught:
                if not self._errors.retryable(caught):
                    raise
                error = caught
            then = operation.after(response, error)
            if then is None:
                assert response is not None
                return response
            if response is not None:
                self._sender.close(response)
            if then.reauthenticate:
                assert self._reauthenticate is not None
                operation.headers.update(self._reauthenticate())
            if then.wait is not None:
                self._sleep(then.wait)

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
        operation = Operation(
            method,
            url,
            options,
            self.policy,
            can_reauthenticate=self._reauthenticate is not None,
            clock=self._clock,
            jitter=self._jitter,
        )
        while True:
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
            then = operation.after(response, error)
            if then is None:
                assert response is not None
                return response
            if response is not None:
                await response.aclose()
            if then.reauthenticate:
                assert self._reauthenticate is not None
                operation.headers.update(await self._reauthenticate())
            if then.wait is not None:
                await self._sleep(then.wait)

    async def post(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("POST", url, **options)

    async def put(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("PUT", url, **options)

    async def patch(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("PATCH", url, **options)

    async def delete(self, url: str, **options: Unpack[RequestOptions]) -> httpx.Response:
        return await self.request("DELETE", url, **options)
