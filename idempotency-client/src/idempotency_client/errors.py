"""How an operation ends without a final answer."""

from __future__ import annotations

from typing import Generic, TypeVar

ResponseT = TypeVar("ResponseT")


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
