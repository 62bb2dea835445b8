"""The key contract, in one place: every protected request goes through :func:`protect`
(or :func:`aprotect` for ``async def`` views).

The middleware, the ``@idempotent`` decorator and the DRF integration only
adapt their kind of view to ``protect(request, call_view, options)``.

The rules are written once, as a generator (:func:`_flow`) that yields each
step doing I/O (a store call, the scope lookup, the view, a signal) to a
driver: :func:`protect` runs the steps inline, :func:`aprotect` awaits them,
sending blocking ones to a thread. So the two paths cannot drift apart.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.dispatch import Signal
from django.http import FileResponse, HttpRequest, HttpResponse
from django.http.request import RawPostDataException
from django.http.response import HttpResponseBase

from idempotency_django import problems, signals
from idempotency_django.conf import (
    FORBIDDEN_REPLAY_HEADERS,
    NEVER_RETAINED_CLIENT_ERRORS,
    idempotency_settings,
)
from idempotency_django.keys import InvalidKey, key_digest, parse_key
from idempotency_django.scope import MAX_LOCATION_LENGTH
from idempotency_django.stores import (
    BaseStore,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
    get_store,
)

logger = logging.getLogger("idempotency_django")

REPLAYED_HEADER = "Idempotency-Replayed"

#: Set on the Django request while it is being protected, so a second layer
#: (middleware + decorator, a wrapped method calling another) stays out.
ACTIVE_ATTRIBUTE = "_idempotency_active"


@dataclass(frozen=True)
class ViewOptions:
    """Per-view overrides of the global settings; None means "use the setting"."""

    required: bool | None = None
    retention: int | None = None
    retain_client_errors: bool | None = None
    atomic: bool | None = None


@dataclass(frozen=True)
class _Blocking:
    """Synchronous work that may touch the database or the network."""

    call: Callable[[], Any]


@dataclass(frozen=True)
class _Send:
    signal: Signal
    kwargs: dict[str, Any]


class _RunView:
    """Call the view; the driver sends back its response."""


_RUN_VIEW = _RunView()

_Flow = Generator["_Blocking | _Send | _RunView", Any, HttpResponseBase]


def _resume(flow: _Flow, step: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Hand the flow the last step's result (or raise its error in it).

    Returns ``(False, next_step)``, or ``(True, response)`` once the flow is done.
    """
    try:
        return False, (flow.send(step) if error is None else flow.throw(error))
    except StopIteration as finished:
        return True, finished.value


def protect(
    request: HttpRequest,
    call_view: Callable[[], HttpResponseBase],
    options: ViewOptions = ViewOptions(),
) -> HttpResponseBase:
    """Run ``call_view`` at most once per key and scope; answer duplicates from the store."""
    flow = _flow(request, options, can_be_atomic=True)
    step: Any = None
    error: BaseException | None = None
    while True:
        done, effect = _resume(flow, step, error)
        if done:
            return effect  # type: ignore[no-any-return]
        step, error = None, None
        try:
            if isinstance(effect, _Blocking):
                step = effect.call()
            elif isinstance(effect, _Send):
                effect.signal.send(**effect.kwargs)
            else:
                step = call_view()
        except BaseException as exc:
            error = exc


async def aprotect(
    request: HttpRequest,
    call_view: Callable[[], Awaitable[HttpResponseBase]],
    options: ViewOptions = ViewOptions(),
) -> HttpResponseBase:
    """:func:`protect` for ``async def`` views: blocking steps run in a worker thread.

    Django runs no async view inside a transaction, so ``atomic`` does not apply.
    """
    flow = _flow(request, options, can_be_atomic=False)
    step: Any = None
    error: BaseException | None = None
    while True:
        done, effect = _resume(flow, step, error)
        if done:
            return effect  # type: ignore[no-any-return]
        step, error = None, None
        try:
            if isinstance(effect, _Blocking):
                step = await sync_to_async(effect.call)()
            elif isinstance(effect, _Send):
                await sync_to_async(effect.signal.send)(**effect.kwargs)
            else:
                step = await call_view()
        except BaseException as exc:
            error = exc


def _flow(request: HttpRequest, options: ViewOptions, *, can_be_atomic: bool) -> _Flow:
    settings = idempotency_settings
    django_request = _django_request(request)
    if request.method not in settings.METHODS or getattr(django_request, ACTIVE_ATTRIBUTE, False):
        return (yield from _unprotected())
    raw_key = request.headers.get(settings.HEADER)
    if raw_key is None:
        if _option(options.required, settings.REQUIRED):
            return problems.problem_response(
                400, problems.KEY_MISSING, f"This endpoint requires an {settings.HEADER} header."
            )
        return (yield from _unprotected())

    try:
        key = parse_key(raw_key)
    except InvalidKey as exc:
        _log(logging.INFO, "rejected", request, code=problems.KEY_INVALID)
        return problems.problem_response(400, problems.KEY_INVALID, str(exc))

    # request.user may need a database query: a blocking step.
    scope = yield _Blocking(lambda: settings.SCOPE_FUNCTION(request))
    if scope is None:
        if settings.ANONYMOUS == "reject":
            return problems.problem_response(
                401,
                problems.AUTHENTICATION_REQUIRED,
                f"Requests with an {settings.HEADER} must be authenticated.",
            )
        _log(logging.INFO, "unprotected", request, reason="anonymous")
        return (yield from _unprotected())
    if len(scope.location) > MAX_LOCATION_LENGTH or not scope.location.isprintable():
        return problems.problem_response(
            400,
            problems.LOCATION_INVALID,
            f"The {settings.LOCATION_HEADER} header must be at most "
            f"{MAX_LOCATION_LENGTH} printable characters.",
        )

    try:
        fingerprint = settings.FINGERPRINT_FUNCTION(request)
    except RawPostDataException:
        return problems.problem_response(
            400,
            problems.BODY_UNAVAILABLE,
            "The request body was consumed before it could be fingerprinted.",
        )

    record_key = RecordKey(scope.principal, scope.location, key)
    digest = key_digest(scope.principal, scope.location, key)
    store = get_store()
    info = RequestInfo(
        method=str(request.method),
        path=request.path,
        fingerprint=fingerprint,
        request_id=str(request.headers.get(settings.REQUEST_ID_HEADER, ""))[:255],
    )
    attempt = _Attempt(request, store, record_key, digest, options, info)
    try:
        claim = yield _Blocking(lambda: store.claim(record_key, info, int(settings.LOCK_TIMEOUT)))
    except StoreUnavailable as exc:
        attempt.log(logging.ERROR, "unavailable", error=type(exc.__cause__ or exc).__name__)
        yield attempt.send(signals.unavailable, error=exc)
        return problems.problem_response(
            503,
            problems.UNAVAILABLE,
            "The idempotency key could not be claimed; nothing was done. Retry with the same key.",
            retry_after=int(settings.UNAVAILABLE_RETRY_AFTER),
        )

    if claim.outcome is Outcome.REPLAY:
        assert claim.response is not None
        attempt.log(logging.INFO, "replayed", status=claim.response.status)
        yield attempt.send(signals.replayed, status=claim.response.status)
        return replay_response(claim.response)
    if claim.outcome is Outcome.REUSED:
        attempt.log(logging.INFO, "conflict", code=problems.KEY_REUSED)
        yield attempt.send(signals.conflict, code=problems.KEY_REUSED)
        return problems.problem_response(
            int(settings.REUSE_STATUS),
            problems.KEY_REUSED,
            "This idempotency key was already used with a different request. "
            "Use a new key for a new operation.",
        )
    if claim.outcome is Outcome.IN_PROGRESS:
        attempt.log(logging.INFO, "conflict", code=problems.KEY_IN_PROGRESS)
        yield attempt.send(signals.conflict, code=problems.KEY_IN_PROGRESS)
        return problems.problem_response(
            409,
            problems.KEY_IN_PROGRESS,
            "A request with this idempotency key is still being processed. "
            "Retry shortly to get its response.",
            retry_after=int(settings.RETRY_AFTER),
        )

    attempt.token = claim.token
    attempt.attempt = "takeover" if claim.took_over else "first"
    attempt.log(logging.INFO, "reserved")
    yield attempt.send(signals.reserved)
    atomic = can_be_atomic and _option(options.atomic, settings.ATOMIC)
    return (yield from attempt.run(atomic=bool(atomic) and store.supports_atomic))


def _unprotected() -> _Flow:
    response: HttpResponseBase = yield _RUN_VIEW
    return response


class _Attempt:
    """One claimed key: runs the view, then stores or releases."""

    def __init__(
        self,
        request: HttpRequest,
        store: BaseStore,
        key: RecordKey,
        digest: str,
        options: ViewOptions,
        info: RequestInfo,
    ) -> None:
        self.request = request
        self.info = info
        self.store = store
        self.key = key
        self.digest = digest
        self.options = options
        self.token = ""
        #: For the logs: "first" or "takeover" once claimed; any request that
        #: finds the key held is a "retry" of the operation.
        self.attempt = "retry"

    def run(self, *, atomic: bool) -> _Flow:
        django_request = _django_request(self.request)
        setattr(django_request, ACTIVE_ATTRIBUTE, True)
        release_reason: str | None = None
        try:
            # In the sync driver this block stays open across the steps, so
            # the view and complete() share one transaction.
            with self.store.atomic() if atomic else contextlib.nullcontext():
                response: HttpResponseBase = yield _RUN_VIEW
                release_reason = yield from self.finish(response)
        except GeneratorExit:
            raise
        except BaseException:
            yield from self.release(None, "exception")
            raise
        finally:
            setattr(django_request, ACTIVE_ATTRIBUTE, False)
        if release_reason is not None:
            # Outside the atomic block: a release must survive its rollback.
            yield from self.release(response.status_code, release_reason)
        return response

    def finish(self, response: HttpResponseBase) -> Generator[Any, Any, str | None]:
        """Store the response, or say why the key must be released instead."""
        status = response.status_code
        if response.streaming or isinstance(response, FileResponse):
            return "streaming"
        if status >= 500:
            return "server_error"
        if not self.retains(status):
            return "not_retained"
        if (yield _Blocking(self.store.in_rolled_back_transaction)):
            return "rolled_back"
        assert isinstance(response, HttpResponse)
        stored = StoredResponse(
            status=status, headers=replay_headers(response), body=response.content
        )
        retention = int(_option(self.options.retention, idempotency_settings.RETENTION))
        try:
            owned = yield _Blocking(
                lambda: self.store.complete(
                    self.key, self.token, stored, retention, request=self.info
                )
            )
        except StoreUnavailable as exc:
            if (yield _Blocking(self.store.in_transaction)):
                # The work must not commit without its record: fail the transaction.
                raise
            # The work is done; the client gets its answer. The reservation
            # expires after LOCK_TIMEOUT and a retry may then run again.
            self.log(
                logging.ERROR,
                "store_failed",
                status=status,
                error=type(exc.__cause__ or exc).__name__,
            )
            return None
        if owned:
            self.log(logging.INFO, "stored", status=status)
            yield self.send(signals.stored, status=status)
        else:
            self.log(logging.WARNING, "lost_reservation", status=status)
        return None

    def retains(self, status: int) -> bool:
        if status < 400:
            return True
        keep_client_errors = _option(
            self.options.retain_client_errors, idempotency_settings.RETAIN_CLIENT_ERRORS
        )
        return bool(keep_client_errors) and status not in NEVER_RETAINED_CLIENT_ERRORS

    def release(self, status: int | None, reason: str) -> Generator[Any, Any, None]:
        try:
            yield _Blocking(lambda: self.store.release(self.key, self.token))
        except StoreUnavailable as exc:
            self.log(
                logging.ERROR,
                "release_failed",
                status=status,
                reason=reason,
                error=type(exc.__cause__ or exc).__name__,
            )
            return
        self.log(logging.INFO, "released", status=status, reason=reason)
        yield self.send(signals.released, status=status, reason=reason)

    def send(self, signal: Signal, **kwargs: Any) -> _Send:
        return _Send(
            signal,
            {
                "sender": type(self.store),
                "request": self.request,
                "key_digest": self.digest,
                **kwargs,
            },
        )

    def log(self, level: int, event: str, **fields: Any) -> None:
        _log(level, event, self.request, key_digest=self.digest, attempt=self.attempt, **fields)


def replay_headers(response: HttpResponse) -> tuple[tuple[str, str], ...]:
    allowed = idempotency_settings.REPLAY_HEADERS
    return tuple(
        (name, value)
        for name, value in response.items()
        if name.upper() in allowed and name.lower() not in FORBIDDEN_REPLAY_HEADERS
    )


def replay_response(stored: StoredResponse) -> HttpResponse:
    response = HttpResponse(stored.body, status=stored.status)
    del response["Content-Type"]  # only what the original response said
    for name, value in stored.headers:
        response[name] = value
    response[REPLAYED_HEADER] = "true"
    return response


def _option(value: Any, default: Any) -> Any:
    return default if value is None else value


def _django_request(request: HttpRequest) -> HttpRequest:
    # DRF's Request wraps the Django one; the flag must live on the shared object.
    return getattr(request, "_request", request)


def _log(level: int, event: str, request: HttpRequest, **fields: Any) -> None:
    """One structured line per decision. Never the key, a header value or the body."""
    if not logger.isEnabledFor(level):
        return
    fields = {
        "event": event,
        "method": request.method,
        "path": request.path,
        "request_id": request.headers.get(idempotency_settings.REQUEST_ID_HEADER, ""),
        **fields,
    }
    line = " ".join(f"{name}={value}" for name, value in fields.items() if value is not None)
    logger.log(level, "idempotency %s", line, extra={"idempotency": fields})
