"""The key contract in two phases, in the style of atomic phases.

Every protected request goes through these; the middleware, ``@idempotent``,
DRF and webhook deduplication only adapt them to their kind of view::

    outcome = begin(request, options)
    if outcome is None:                       # not a keyed unsafe request
        response = get_response(request)
    elif isinstance(outcome, HttpResponseBase):
        response = outcome                    # replay, conflict or error
    else:                                     # an Attempt: the key is ours
        try:
            response = get_response(request)
        except BaseException as error:
            outcome.abort(error)              # let a retry run
            raise
        response = outcome.finish(response)   # store it, or release the key

:func:`run` is exactly that, :func:`arun` the same for ``async def`` views
(the phases' blocking I/O runs in a worker thread). What a refusal says is
in :mod:`~idempotency_django.problems`, the log line in
:mod:`~idempotency_django.logs`. Under
``WAIT_FOR_IN_PROGRESS`` phase 1 may also answer :class:`Busy` (another
request holds the key): the driver then waits for it outside any
transaction, and begins again.

Transactions decide what "exactly once" means:

* The store's claim joined a database transaction that is open around the
  view (``ATOMIC_REQUESTS``, ``atomic=True``): the reservation, the view's
  writes and the stored response commit or roll back together.
* The view's writes are in a transaction the store is not part of (the Redis
  store, or a store on another database): before that transaction commits,
  :meth:`Attempt.finish` renews the reservation. A request that lost it
  (taken over after ``LOCK_TIMEOUT``) rolls its work back; otherwise the
  response is stored once the work has committed.
* No transaction: each store call commits on its own.

Whatever the transaction, its outcome decides: a 5xx answer rolls the
work back with the reservation, a failed COMMIT keeps no answer, and a
client that hangs up under ASGI cancels nothing (:func:`run_to_the_end`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.dispatch import Signal
from django.http import FileResponse, HttpRequest, HttpResponse
from django.http.request import RawPostDataException
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string
from django.utils.translation import gettext

from idempotency_django import problems, signals
from idempotency_django.conf import NEVER_RETAINED_CLIENT_ERRORS, header, idempotency_settings
from idempotency_django.fingerprint import BodyTooLarge, prepare_body
from idempotency_django.heartbeat import Beat, start_beat
from idempotency_django.keys import InvalidKey, parse_key
from idempotency_django.logs import log, request_id, route_of
from idempotency_django.marks import django_request
from idempotency_django.problems import refuse, replay_headers, replay_response
from idempotency_django.scope import MAX_LOCATION_LENGTH, Scope, session_scope
from idempotency_django.stores import (
    Claim,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
    get_store,
)
from idempotency_django.stores.base import backoff
from idempotency_django.waiting import waiting_slot

ResultT = TypeVar("ResultT")
OptionT = TypeVar("OptionT")

#: Set on the Django request while its key is claimed, so that a second layer
#: (a DRF handler calling an inherited protected handler) stays out.
ACTIVE_ATTRIBUTE = "_idempotency_active"
#: Set on the Django request by phase 1: "protected" once a part of the
#: library took charge of its key, "anonymous" when it let it through.
DECISION_ATTRIBUTE = "_idempotency_decision"
#: Set on the Django request by a claim: the :class:`RecordKey` the request
#: holds (what :func:`idempotency_django.downstream.downstream_key` derives from).
KEY_ATTRIBUTE = "_idempotency_key"
#: Set on the Django request by :func:`note_handled_exception`: the exception
#: DRF or ninja turned into the response, for a ``RETAIN_FUNCTION`` to look at.
HANDLED_EXCEPTION_ATTRIBUTE = "_idempotency_handled_exception"
#: The routes whose unprotected keyed requests were logged (once each).
_LOGGED_UNPROTECTED: set[tuple[str, str]] = set()


#: ``RETAIN_FUNCTION``: whether an answer is kept for replay, given the request,
#: the response and the exception DRF or ninja turned into it (None if none).
RetainFunction = Callable[[HttpRequest, HttpResponseBase, Exception | None], bool]


@dataclass(frozen=True)
class ViewOptions:
    """Per-view overrides of the global settings; None means "use the setting"."""

    required: bool | None = None
    retention: int | None = None
    retain_client_errors: bool | None = None
    atomic: bool | None = None
    max_stored_body: int | None = None
    wait_for_in_progress: float | None = None
    #: A function (or its dotted path) used instead of ``FINGERPRINT_FUNCTION``.
    fingerprint: Callable[[HttpRequest], str] | str | None = None
    #: A function (or its dotted path) used instead of ``SCOPE_FUNCTION``.
    scope: Callable[[HttpRequest], Scope | None] | str | None = None
    #: A function (or its dotted path) used instead of ``RETAIN_FUNCTION``.
    retain: RetainFunction | str | None = None


# -- running a view through the phases -----------------------------------------

#: What runs the view: Django's ``get_response`` or a view called with its arguments.
GetResponse = Callable[[HttpRequest], HttpResponseBase]
AsyncGetResponse = Callable[[HttpRequest], Awaitable[HttpResponseBase]]
#: The transaction to run phase 1, the view and phase 2 in (or none).
Block = Callable[[], contextlib.AbstractContextManager[Any]]


class BeginPhase(Protocol):
    """Phase 1: :func:`begin`, or the webhooks' ``begin_delivery`` with its rules bound."""

    def __call__(
        self, request: HttpRequest, options: ViewOptions, /
    ) -> Attempt | Busy | HttpResponseBase | None: ...


def run(
    request: HttpRequest,
    options: ViewOptions,
    get_response: GetResponse,
    block: Block = contextlib.nullcontext,
    begin_phase: BeginPhase | None = None,
) -> HttpResponseBase:
    """Begin; run the view unless answered; then finish or abort. All in ``block``."""
    protection = Protection(request, options, block, begin_phase)
    answer = protection.enter()
    if answer is not None:
        return answer  # a replay, a conflict, a refusal: the view does not run
    try:
        response = get_response(request)
    except BaseException as error:
        protection.fail(error)
        raise
    return protection.exit(response)


class Protection:
    """:func:`run` in three steps, for a caller whose view runs between two hooks (DRF).

    :meth:`enter` opens ``block`` and begins (a :class:`Busy` key is waited for
    outside ``block``, then phase 1 begins again). An answer it returns is sent
    instead of the view; None: run the view, then :meth:`exit` with its
    response, or :meth:`fail` with what it raised. Either closes ``block``.
    """

    def __init__(
        self,
        request: HttpRequest,
        options: ViewOptions,
        block: Block = contextlib.nullcontext,
        begin_phase: BeginPhase | None = None,
    ) -> None:
        self.request = request
        self.options = options
        self.block = block
        self.begin_phase = begin_phase or begin
        self.attempt: Attempt | None = None
        self.stack = contextlib.ExitStack()

    def enter(self) -> HttpResponseBase | None:
        deadline = None
        while True:
            with contextlib.ExitStack() as stack:
                stack.enter_context(self.block())
                outcome = self.begin_phase(self.request, self.options)
                if outcome is None or isinstance(outcome, Attempt):
                    self.attempt = outcome
                    self.stack = stack.pop_all()  # the view runs in the block
                    return None
                if isinstance(outcome, HttpResponseBase):
                    return outcome
            deadline = deadline or time.monotonic() + outcome.seconds
            remaining = deadline - time.monotonic()
            if remaining <= 0 or _open_transactions():
                # Waiting would hold a transaction someone else opened: answer now.
                return outcome.conflict()
            if not outcome.wait(remaining):
                return outcome.conflict()  # too many waiters already: 409 at once

    def exit(self, response: HttpResponseBase) -> HttpResponseBase:
        """The view answered: store the answer or release the key, then close the block."""
        try:
            with self.stack:
                if self.attempt is not None:
                    response = self.attempt.finish(response)
                else:
                    mark_ignored_key(self.request, response, unprotected=False)
        except BaseException:
            self.commit_failed()
            raise
        return response

    def fail(self, error: BaseException) -> None:
        """The view raised ``error``: abort the attempt, then close the block with it."""
        try:
            if self.attempt is not None:
                self.attempt.abort(error)
        finally:
            try:
                self.stack.__exit__(type(error), error, error.__traceback__)
            finally:
                self.commit_failed()

    def commit_failed(self) -> None:
        if self.attempt is not None:
            self.attempt.commit_failed()


async def arun(
    request: HttpRequest,
    options: ViewOptions,
    get_response: AsyncGetResponse,
    begin_phase: BeginPhase | None = None,
) -> HttpResponseBase:
    """:func:`run` for async views: the phases' blocking I/O runs in a worker thread.

    A :class:`Busy` key is waited for with ``asyncio.sleep`` between looks at
    the store: the event loop goes on serving other requests. A client that
    hangs up stops nothing: see :func:`run_to_the_end`.
    """
    return await run_to_the_end(_arun(request, options, get_response, begin_phase or begin))


async def _arun(
    request: HttpRequest,
    options: ViewOptions,
    get_response: AsyncGetResponse,
    begin_phase: BeginPhase,
) -> HttpResponseBase:
    deadline = None
    while True:
        outcome = await sync_to_async(begin_phase)(request, options)
        if not isinstance(outcome, Busy):
            break
        deadline = deadline or time.monotonic() + outcome.seconds
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return await sync_to_async(outcome.conflict)()
        if not await outcome.await_settled(remaining):
            return await sync_to_async(outcome.conflict)()  # too many waiters already
    if outcome is None:
        response = await get_response(request)
        mark_ignored_key(request, response, unprotected=False)
        return response
    if isinstance(outcome, HttpResponseBase):
        return outcome
    try:
        response = await get_response(request)
    except BaseException as error:
        await sync_to_async(outcome.abort)(error)
        raise
    finished: HttpResponseBase = await sync_to_async(outcome.finish)(response)
    return finished


async def run_to_the_end(work: Awaitable[ResultT]) -> ResultT:
    """Await ``work`` to its end, even when the client hangs up meanwhile.

    Django cancels a request's task when its client disconnects. A cancelled
    claim or view may still commit (a thread cannot be stopped, and a write
    already sent commits), so releasing the key then would let the retry run
    the work again, and stopping after the claim would strand the key. The
    work goes on instead, its answer is stored for the retry, and only then
    does the cancellation go on to Django (which waits for it).
    """
    task = asyncio.ensure_future(work)
    hung_up = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            hung_up = True
    if hung_up:
        if not task.cancelled():
            task.exception()  # nobody is left to get it: the client is gone
        raise asyncio.CancelledError
    return task.result()


def protect(
    request: HttpRequest,
    call_view: Callable[[], HttpResponseBase],
    options: ViewOptions = ViewOptions(),
) -> HttpResponseBase:
    """Run ``call_view`` at most once per key and scope; answer duplicates from the store.

    With ``atomic`` (the option or the ``ATOMIC`` setting) the claim, the view
    and the completion run in one transaction.
    """
    return run(request, options, lambda _request: call_view(), transaction_block(options))


async def aprotect(
    request: HttpRequest,
    call_view: Callable[[], Awaitable[HttpResponseBase]],
    options: ViewOptions = ViewOptions(),
) -> HttpResponseBase:
    """:func:`protect` for ``async def`` views.

    Django runs no async view inside a transaction, so ``atomic`` does not apply.
    """
    return await arun(request, options, lambda _request: call_view())


def transaction_block(options: ViewOptions) -> Block:
    """One transaction around claim, view and completion with ``atomic``; else none."""
    atomic = _option(options.atomic, idempotency_settings.ATOMIC)
    return atomic_block if atomic else contextlib.nullcontext


def atomic_block() -> Any:
    """A transaction on the store's database (the default database for other stores)."""
    return transaction.atomic(using=get_store().database_alias or DEFAULT_DB_ALIAS)


# -- phase 1 --------------------------------------------------------------------


def begin(
    request: HttpRequest, options: ViewOptions = ViewOptions()
) -> Attempt | Busy | HttpResponseBase | None:
    """Decide what a request gets before its view runs.

    None: not a protected request (a safe method, no key, an anonymous
    principal under ``ANONYMOUS="ignore"``): run the view as usual. A
    response: send it and do not run the view (a replay, a conflict, a bad
    key, the store down). An :class:`Attempt`: the key is claimed for this
    request; run the view, then ``finish`` or ``abort`` the attempt. A
    :class:`Busy`: another request holds the key and the view waits for it
    (``WAIT_FOR_IN_PROGRESS``); :func:`run` handles it.
    """
    settings = idempotency_settings
    if (
        not settings.ENABLED
        or request.method not in settings.METHODS
        or getattr(django_request(request), ACTIVE_ATTRIBUTE, False)
    ):
        return None
    raw_key = header(request, settings.HEADER)
    if raw_key is None:
        if _option(options.required, settings.REQUIRED):
            return refuse(request, problems.KEY_MISSING)
        return None
    decide(request, "protected")
    try:
        key = parse_key(raw_key)
    except InvalidKey as exc:
        log(logging.INFO, "rejected", request, code=problems.KEY_INVALID)
        return refuse(request, problems.KEY_INVALID, detail=exc.translated(gettext))

    scope = scope_of(request, options)
    if scope is None:
        if settings.ANONYMOUS == "reject":
            return refuse(request, problems.AUTHENTICATION_REQUIRED)
        log(logging.INFO, "unprotected", request, reason="anonymous")
        decide(request, "anonymous")
        return None
    if len(scope.location) > MAX_LOCATION_LENGTH or not scope.location.isprintable():
        return refuse(
            request,
            problems.LOCATION_INVALID,
            header=settings.LOCATION_HEADER,
            length=MAX_LOCATION_LENGTH,
        )
    try:
        prepare_body(request)
        fingerprint = _function(options.fingerprint, settings.FINGERPRINT_FUNCTION)(request)
    except RawPostDataException:
        return refuse(request, problems.BODY_UNAVAILABLE)
    except BodyTooLarge as exc:
        return exc.answer(request)
    info = RequestInfo(
        method=str(request.method),
        path=request.path,
        fingerprint=fingerprint,
        request_id=request_id(request),
    )
    attempt = Attempt(request, RecordKey(scope.principal, scope.location, key), info, options)
    outcome = attempt.claim()
    if isinstance(outcome, HttpResponseBase):
        attempt.echo_key(outcome)
    return outcome


class Attempt:
    """One claim of a key: :meth:`claim` it, then :meth:`finish` or :meth:`abort`.

    Subclasses change the answers (webhook deliveries answer duplicates with
    ``202``), never the order of the steps.
    """

    def __init__(
        self,
        request: HttpRequest,
        key: RecordKey,
        info: RequestInfo,
        options: ViewOptions = ViewOptions(),
    ) -> None:
        self.request = request
        self.key = key
        self.info = info
        self.options = options
        self.store = get_store()
        self.digest = key.digest[:16]  # keys.key_digest(), computed once
        self.token = ""
        #: For the logs: "first" or "takeover" once claimed; any request that
        #: finds the key held is a "retry" of the operation.
        self.attempt = "retry"
        #: The claim joined a database transaction that is open around the view.
        self.joined_transaction = False
        #: ... and that transaction is the only one: the work and its record
        #: commit together (with several, the store is outside the work).
        self.in_transaction = False
        #: The answer to store once the work's transactions have committed.
        self.deferred: StoredResponse | None = None
        #: The databases whose commit the deferred answer waits for.
        self.uncommitted: set[str] = set()
        #: Who the request was authenticated as when the key was claimed.
        self.authenticated_as: tuple[Any, ...] = ()
        #: With HEARTBEAT: the renewal of a reservation committed on its own.
        self.beat: Beat | None = None

    # -- phase 1: claim --

    def claim(self) -> Attempt | Busy | HttpResponseBase:
        """Claim the key: this attempt when it is ours, else the answer to send."""
        work = _open_transactions()
        self.joined_transaction = self.store.joins_transaction()
        self.in_transaction = self.joined_transaction and work == [self.store.database_alias]
        try:
            claim = self.store.claim(self.key, self.info, self.lock_timeout())
        except StoreUnavailable as exc:
            self.log(logging.ERROR, "unavailable", error=_error_name(exc))
            self.send(signals.unavailable, error=exc)
            self.roll_back()
            return self.unavailable()
        if claim.outcome is not Outcome.CLAIMED:
            return self.held(claim)
        self.token = claim.token
        self.attempt = "takeover" if claim.took_over else "first"
        self.authenticated_as = _authenticated_as(self.request)
        if not self.in_transaction:
            # Hooked now, ahead of any the view adds: a hook of the view that
            # raises after the commit cannot skip the completion.
            self.store_after_commit(work)
        too_many = self.over_key_limit()
        if too_many is not None:
            return too_many
        self.log(logging.INFO, "reserved")
        self.send(signals.reserved)
        if not self.joined_transaction:
            self.beat = start_beat(self.store, self.key, self.token, self.info, self.lock_timeout())
        setattr(django_request(self.request), ACTIVE_ATTRIBUTE, True)
        setattr(django_request(self.request), KEY_ATTRIBUTE, self.key)
        return self

    def over_key_limit(self) -> HttpResponseBase | None:
        """With ``MAX_KEYS_PER_PRINCIPAL``: 429, and the key given back, for one key too many.

        Counted once the key is claimed, so a replay or a conflict is never
        refused. Concurrent first requests may each see the other: the limit
        errs on the side of refusing.
        """
        limit = idempotency_settings.MAX_KEYS_PER_PRINCIPAL
        if not limit or not self.store.counts_keys:
            return None
        lifetime = self.lock_timeout() + self.retention()
        try:
            count, first_expiry = self.store.count_keys(self.key, lifetime)
        except StoreUnavailable as exc:
            self.log(logging.ERROR, "unavailable", error=_error_name(exc))
            self.release(None, "unavailable")
            return self.unavailable()
        if count <= limit:
            return None
        self.release(None, "too_many_keys")
        self.log(logging.INFO, "rejected", code=problems.TOO_MANY_KEYS)
        return refuse(
            self.request,
            problems.TOO_MANY_KEYS,
            limit=limit,
            retry_after=max(1, math.ceil(first_expiry or idempotency_settings.RETRY_AFTER)),
        )

    def held(self, claim: Claim) -> HttpResponseBase | Busy:
        """The answer when the key is already taken: a replay or a conflict."""
        if claim.outcome is Outcome.REPLAY:
            assert claim.response is not None
            if claim.response.body_omitted:
                return self.not_stored(claim.response.status)
            self.log(logging.INFO, "replayed", status=claim.response.status)
            self.send(signals.replayed, status=claim.response.status)
            replay = replay_response(claim.response)
            hook = idempotency_settings.REPLAY_HOOK
            return hook(self.request, replay) if hook is not None else replay
        if claim.outcome is Outcome.REUSED:
            self.log(logging.INFO, "conflict", code=problems.KEY_REUSED)
            self.send(signals.conflict, code=problems.KEY_REUSED)
            return refuse(self.request, problems.KEY_REUSED)
        seconds = _option(
            self.options.wait_for_in_progress, idempotency_settings.WAIT_FOR_IN_PROGRESS
        )
        if seconds > 0:
            return Busy(self, seconds)
        return self.conflict_in_progress()

    def conflict_in_progress(self) -> HttpResponseBase:
        self.log(logging.INFO, "conflict", code=problems.KEY_IN_PROGRESS)
        self.send(signals.conflict, code=problems.KEY_IN_PROGRESS)
        return self.in_progress()

    def not_stored(self, status: int) -> HttpResponseBase:
        """The first request ran, but its response was too large to keep: say so, run nothing."""
        self.log(logging.INFO, "conflict", code=problems.RESPONSE_NOT_STORED, status=status)
        self.send(signals.conflict, code=problems.RESPONSE_NOT_STORED)
        return refuse(
            self.request,
            problems.RESPONSE_NOT_STORED,
            status=status,
            extensions={"original_status": status},
        )

    def in_progress(self) -> HttpResponseBase:
        return refuse(self.request, problems.KEY_IN_PROGRESS)

    def unavailable(self) -> HttpResponseBase:
        return refuse(self.request, problems.UNAVAILABLE)

    # -- phase 2: finish or abort --

    def echo_key(self, response: HttpResponseBase) -> None:
        """Name the key on the answer when ``ECHO_KEY_HEADER`` asks for it."""
        header = idempotency_settings.ECHO_KEY_HEADER
        if header:
            response[header] = self.key.key

    def finish(self, response: HttpResponseBase) -> HttpResponseBase:
        """Store the view's response for replay, or release the key; return what to send.

        Whatever raises here (a view that returned no response, a lazy
        response that fails to render) aborts the attempt: the key is not
        left reserved for work whose answer nobody got.
        """
        try:
            if not isinstance(response, HttpResponseBase):
                raise TypeError(
                    f"The view protected by idempotency_django returned {type(response).__name__}, "
                    "not a Django response. On a django-ninja operation, use "
                    "idempotency_django.ninja.idempotent."
                )
            answer = self.finish_attempt(response)
        except BaseException as error:
            self.abort(error)
            raise
        self.echo_key(answer)
        return answer

    def finish_attempt(self, response: HttpResponseBase) -> HttpResponseBase:
        setattr(django_request(self.request), ACTIVE_ATTRIBUTE, False)
        status = response.status_code
        reason = self.release_reason(response)
        work = _open_transactions()
        if status >= 500:
            # A 5xx is never kept, so the retry runs: its work must not commit
            # either, whatever made the answer a 5xx (the view, a middleware
            # after this one, a template that failed to render).
            _roll_back(work)
        if self.rolled_back():
            # The reservation goes with the claim's transaction: nothing to
            # store, nothing to release.
            self.log(logging.INFO, "released", status=status, reason="rollback")
            return response
        if reason is not None:
            self.release(status, reason)
            return response
        if self.in_transaction:
            # In the work's transaction: both commit, or neither does.
            return response if self.complete(self.stored_response(response)) else self.unavailable()
        if work:
            return self.finish_before_commit(response, work)
        self.complete(self.stored_response(response))
        return response

    def finish_before_commit(self, response: HttpResponseBase, work: list[str]) -> HttpResponseBase:
        """The work's transactions are still open and the store is not part of them.

        Renew the reservation now, so that no retry can take it over before
        the commit, and store the response once every one of them has
        committed. A request that lost its reservation rolls its work back.
        """
        if any(connections[alias].needs_rollback for alias in work):
            self.release(response.status_code, "rollback")
            return response
        try:
            owned = self.store.renew(self.key, self.token, self.lock_timeout(), self.info)
        except StoreUnavailable as exc:
            # Whether the key is still ours cannot be told: commit nothing.
            self.log(logging.ERROR, "store_failed", error=_error_name(exc))
            self.stop_heartbeat()
            _roll_back(work)
            return self.unavailable()
        if not owned:
            self.log(logging.WARNING, "lost_reservation", status=response.status_code)
            self.stop_heartbeat()
            _roll_back(work)
            return self.in_progress()
        self.deferred = self.stored_response(response)
        if self.beat is not None:
            # The commit is next: a completion that never comes (a COMMIT that
            # failed drops its hooks) must not keep the key to MAX_RUN_TIME.
            self.beat.stop_after(self.lock_timeout())
        self.store_after_commit(work)
        return response

    def store_after_commit(self, work: list[str]) -> None:
        """Store the deferred answer once each database of ``work`` has committed."""
        for alias in set(work) - self.uncommitted:
            self.uncommitted.add(alias)
            hook = functools.partial(self.committed, alias)
            transaction.on_commit(hook, using=alias, robust=True)

    def committed(self, alias: str) -> None:
        self.uncommitted.discard(alias)
        if self.uncommitted or self.deferred is None:
            return
        stored, self.deferred = self.deferred, None
        self.complete(stored)

    def commit_failed(self) -> None:
        """The transaction around the view ended in an exception: its work did not commit."""
        if self.deferred is not None:
            self.deferred = None
            self.release(None, "rollback")

    def abort(self, error: BaseException | None = None) -> None:
        """The view raised: let a retry run, unless the view was only cancelled.

        A cancelled view (its client hung up, under ASGI) may have written
        and may still commit: its reservation is kept until ``LOCK_TIMEOUT``
        (with ``HEARTBEAT``, renewed until ``MAX_RUN_TIME``), or goes with the
        claim's transaction if that rolls back.
        """
        setattr(django_request(self.request), ACTIVE_ATTRIBUTE, False)
        if self.rolled_back():
            return  # the reservation goes with the rollback
        if isinstance(error, asyncio.CancelledError):
            self.log(logging.WARNING, "cancelled")
            return
        self.release(None, "exception")

    def release_reason(self, response: HttpResponseBase) -> str | None:
        """Why ``response`` must not be stored, or None to store it."""
        status = response.status_code
        if response.streaming or isinstance(response, FileResponse):
            return "streaming"
        if status >= 500:
            return "server_error"
        if self.principal_changed():
            return "principal_changed"
        return None if self.retains(response) else "not_retained"

    def retains(self, response: HttpResponseBase) -> bool:
        """Whether an answer that may be kept (not a 5xx, not streamed) is.

        The view's own choice first (its ``retain`` function, then its
        ``retain_client_errors``), then the project's (``RETAIN_FUNCTION``, then
        ``RETAIN_CLIENT_ERRORS``). Without a function 2xx/3xx are kept, and 4xx
        when client errors are, except :data:`NEVER_RETAINED_CLIENT_ERRORS`.
        """
        project = idempotency_settings.RETAIN_FUNCTION
        retain = _function(
            self.options.retain, project if self.options.retain_client_errors is None else None
        )
        if retain is not None:
            handled = getattr(django_request(self.request), HANDLED_EXCEPTION_ATTRIBUTE, None)
            try:
                return bool(retain(self.request, response, handled))
            except Exception as exc:
                # The work is done: failing the request now would free its key
                # and run it again. The booleans decide instead.
                self.log(logging.ERROR, "retain_failed", error=type(exc).__name__)
        status = response.status_code
        if status < 400:
            return True
        keep_client_errors = _option(
            self.options.retain_client_errors, idempotency_settings.RETAIN_CLIENT_ERRORS
        )
        return bool(keep_client_errors) and status not in NEVER_RETAINED_CLIENT_ERRORS

    def principal_changed(self) -> bool:
        """The view authenticated someone else than the key was claimed for.

        A session-scoped claim whose view then authenticated another principal
        (a token of its own, a login): its answer is not stored under the
        first one, who would otherwise be served it.
        """
        if _same_objects(_authenticated_as(self.request), self.authenticated_as):
            return False  # who the scope is made of was not replaced: the same principal
        scope = scope_of(self.request, self.options)
        if scope is None or scope.principal == self.key.principal:
            return False
        self.log(logging.WARNING, "principal_changed")
        return True

    def stored_response(self, response: HttpResponseBase) -> StoredResponse:
        """What is kept for replay: the bytes the client gets, rendered first if lazy.

        A body over ``MAX_STORED_BODY`` is not kept: only that the request ran,
        and its status, so that a retry neither runs again nor gets a replay.
        """
        if not getattr(response, "is_rendered", True):
            response.render()  # type: ignore[attr-defined]
        assert isinstance(response, HttpResponse)
        body = response.content
        limit = _option(self.options.max_stored_body, idempotency_settings.MAX_STORED_BODY)
        if limit is not None and len(body) > limit:
            self.log(
                logging.WARNING, "body_not_stored", status=response.status_code, size=len(body)
            )
            return StoredResponse(
                status=response.status_code, headers=(), body=b"", body_omitted=True
            )
        return StoredResponse(
            status=response.status_code, headers=replay_headers(response), body=body
        )

    def retention(self) -> int:
        return _option(self.options.retention, idempotency_settings.RETENTION)

    def lock_timeout(self) -> int:
        return idempotency_settings.LOCK_TIMEOUT

    def complete(self, stored: StoredResponse) -> bool:
        """Store the answer. False only when the claim's transaction must now roll back."""
        try:
            owned = self.store.complete(
                self.key, self.token, stored, self.retention(), request=self.info
            )
        except StoreUnavailable as exc:
            self.log(logging.ERROR, "store_failed", status=stored.status, error=_error_name(exc))
            if self.in_transaction:
                # The work must not commit without its record: roll both back.
                self.roll_back()
                return False
            # The work is done and the client gets its answer. The key is not
            # released: retries get 409 in progress until LOCK_TIMEOUT.
            return True
        self.stop_heartbeat()
        if owned:
            self.log(logging.INFO, "stored", status=stored.status)
            self.send(signals.stored, status=stored.status)
            return True
        # Taken over after LOCK_TIMEOUT by a retry, which owns the record now.
        self.log(logging.WARNING, "lost_reservation", status=stored.status)
        return True

    def release(self, status: int | None, reason: str) -> None:
        # Given up, released or not: a release that failed leaves the key to
        # expire LOCK_TIMEOUT after the last renewal.
        self.stop_heartbeat()
        try:
            self.store.release(self.key, self.token)
        except StoreUnavailable as exc:
            self.log(
                logging.ERROR,
                "release_failed",
                status=status,
                reason=reason,
                error=_error_name(exc),
            )
            self.roll_back()
            return
        self.log(logging.INFO, "released", status=status, reason=reason)
        self.send(signals.released, status=status, reason=reason)

    # -- the heartbeat --

    def stop_heartbeat(self) -> None:
        """The key is settled, or given up. A completion that failed keeps its renewals
        to MAX_RUN_TIME: its work is done, and a retry must not run it again."""
        if self.beat is not None:
            self.beat.stop()

    # -- the claim's transaction --

    def rolled_back(self) -> bool:
        """The transaction the claim joined will roll back, the reservation with it."""
        alias = self.store.database_alias
        return (
            self.joined_transaction
            and alias is not None
            and bool(connections[alias].needs_rollback)
        )

    def roll_back(self) -> None:
        """Mark the transaction the claim joined for rollback (a broken one must roll back)."""
        alias = self.store.database_alias
        if self.joined_transaction and alias is not None:
            transaction.set_rollback(True, using=alias)

    # -- reporting --

    def send(self, signal: Signal, **kwargs: Any) -> None:
        if signal.receivers and signal.has_listeners(type(self.store)):
            signal.send(
                sender=type(self.store), request=self.request, key_digest=self.digest, **kwargs
            )

    def log(self, level: int, event: str, **fields: Any) -> None:
        log(level, event, self.request, key_digest=self.digest, attempt=self.attempt, **fields)


@dataclass
class Busy:
    """Phase 1's answer for a key a running request holds, when the view waits for it.

    The driver waits (outside any transaction) until the first request has
    finished or ``seconds`` have passed, then begins again: the retry then
    replays the first request's answer, runs if the first one failed, or gets
    ``409 idempotency_key_in_progress`` after all.
    """

    attempt: Attempt
    seconds: float

    def wait(self, seconds: float) -> bool:
        """Wait for the key to settle; False, at once, past the waiters' bound (waiting.py)."""
        with waiting_slot(self.attempt.key.digest) as admitted:
            if not admitted:
                return False
            self.attempt.log(logging.INFO, "waiting", seconds=round(seconds, 3))
            # On a store failure, begin again: the claim then answers 503 if it stays down.
            with contextlib.suppress(StoreUnavailable):
                self.attempt.store.wait(self.attempt.key, seconds)
        return True

    async def await_settled(self, seconds: float) -> bool:
        """:meth:`wait` for async views, sleeping between looks at the store."""
        with waiting_slot(self.attempt.key.digest) as admitted:
            if not admitted:
                return False
            self.attempt.log(logging.INFO, "waiting", seconds=round(seconds, 3))
            store, key = self.attempt.store, self.attempt.key
            deadline = time.monotonic() + seconds
            for pause in backoff():
                try:
                    if not await sync_to_async(store.is_held)(key):
                        break
                except StoreUnavailable:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.sleep(min(pause, remaining))
        return True

    def conflict(self) -> HttpResponseBase:
        response = self.attempt.conflict_in_progress()
        self.attempt.echo_key(response)
        return response


# -- helpers --------------------------------------------------------------------


def scope_of(request: HttpRequest, options: ViewOptions) -> Scope | None:
    """Whose key it is: the view's scope function or ``SCOPE_FUNCTION``, else a guest's session."""
    scope: Scope | None = _function(options.scope, idempotency_settings.SCOPE_FUNCTION)(request)
    if scope is None and idempotency_settings.ANONYMOUS == "session":
        scope = session_scope(request)
    return scope


def _authenticated_as(request: HttpRequest) -> tuple[Any, ...]:
    """The objects a principal is named from: ``user``, and DRF's or ninja's ``auth``.

    A view that authenticates someone else replaces one of them (``login()``
    sets a new ``request.user``): only then is the scope computed again.
    """
    django = django_request(request)
    return (
        getattr(request, "user", None),
        getattr(django, "user", None),
        getattr(request, "auth", None),
    )


def _same_objects(first: tuple[Any, ...], second: tuple[Any, ...]) -> bool:
    return len(first) == len(second) and all(a is b for a, b in zip(first, second, strict=True))


def note_handled_exception(request: HttpRequest, error: Exception) -> None:
    """An integration's handlers (DRF's, ninja's) answered ``error``: a retain function sees it."""
    setattr(django_request(request), HANDLED_EXCEPTION_ATTRIBUTE, error)


def decide(request: HttpRequest, decision: str) -> None:
    """Note what became of the request's key: "protected" or "anonymous"."""
    setattr(django_request(request), DECISION_ATTRIBUTE, decision)


def mark_ignored_key(
    request: HttpRequest, response: HttpResponseBase, unprotected: bool = True
) -> None:
    """Tell the client of a keyed unsafe request whose key was not used (``IGNORED_KEY_HEADER``).

    The middleware calls it after the view for every keyed unsafe request: one
    no part of the library took charge of is "unprotected" (the first of each
    route is logged at WARNING). :class:`Protection` calls it for the requests
    it let through (``unprotected=False``): "anonymous" ones.
    """
    settings = idempotency_settings
    name = settings.IGNORED_KEY_HEADER
    if not settings.ENABLED:
        return
    decision = getattr(django_request(request), DECISION_ATTRIBUTE, None)
    if decision == "protected" or (decision is None and not unprotected):
        return
    if decision is None:
        decision = "unprotected"
        route = (str(request.method), route_of(request))
        if route not in _LOGGED_UNPROTECTED:
            _LOGGED_UNPROTECTED.add(route)
            log(logging.WARNING, "unprotected", request, reason="not_protected")
    if name:
        response[name] = decision


def _open_transactions() -> list[str]:
    """The databases with a transaction open around the view (test cases' own aside)."""
    return [
        connection.alias
        for connection in connections.all(initialized_only=True)
        if any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)
    ]


def _roll_back(aliases: list[str]) -> None:
    for alias in aliases:
        transaction.set_rollback(True, using=alias)


def roll_back_open_transactions() -> None:
    """Mark every transaction open around the view for rollback."""
    _roll_back(_open_transactions())


def _function(value: Callable[..., Any] | str | None, default: Callable[..., Any] | None) -> Any:
    """A view's own function (given itself or by dotted path), else the setting's."""
    if value is None:
        return default
    return _imported(value) if isinstance(value, str) else value


@functools.cache
def _imported(path: str) -> Any:
    return import_string(path)


def _option(value: OptionT | None, default: OptionT) -> OptionT:
    return default if value is None else value


def _error_name(exc: StoreUnavailable) -> str:
    return type(exc.__cause__ or exc).__name__
