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
(the phases' blocking I/O runs in a worker thread). The :class:`Attempt`'s
steps are in :mod:`~idempotency_django.protocol.attempt` (what it holds in the store,
in :mod:`~idempotency_django.protocol.reservation`), what a refusal says is in
:mod:`~idempotency_django.protocol.problems`, the log line in
:mod:`~idempotency_django.protocol.logs`. Under
``WAIT_FOR_IN_PROGRESS`` phase 1 may also answer :class:`Busy` (another
request holds the key; :mod:`~idempotency_django.protocol.waiting`): the driver then
waits for it outside any transaction, and begins again.

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
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from django.http.request import RawPostDataException
from django.http.response import HttpResponseBase
from django.utils.translation import gettext

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol import problems
from idempotency_django.protocol.attempt import Attempt
from idempotency_django.protocol.bodies import PREPARED_ATTRIBUTE, BodyRefused, prepare_body
from idempotency_django.protocol.keys import InvalidKey, parse_key
from idempotency_django.protocol.logs import log, request_id, route_of
from idempotency_django.protocol.marks import (
    ACTIVE_ATTRIBUTE,
    DECISION_ATTRIBUTE,
    decide,
    django_request,
    key_header,
    note_handled_exception,
)
from idempotency_django.protocol.options import (
    ViewOptions as ViewOptions,  # importable here, as documented
)
from idempotency_django.protocol.options import function, option, scope_of
from idempotency_django.protocol.problems import refuse, reject
from idempotency_django.protocol.scope import MAX_LOCATION_LENGTH
from idempotency_django.protocol.transactions import (
    Block,
    open_transactions,
    roll_back_open_transactions,
    transaction_block,
)
from idempotency_django.protocol.waiting import Busy
from idempotency_django.stores import RecordKey, RequestInfo

ResultT = TypeVar("ResultT")

#: The routes whose unprotected keyed requests were logged (once each).
_LOGGED_UNPROTECTED: set[tuple[str, str]] = set()


# -- running a view through the phases -----------------------------------------

#: What runs the view: Django's ``get_response`` or a view called with its arguments.
GetResponse = Callable[[HttpRequest], HttpResponseBase]
AsyncGetResponse = Callable[[HttpRequest], Awaitable[HttpResponseBase]]


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
        #: ``block``, while the view runs in it (None: no block was opened).
        self.stack: contextlib.ExitStack | None = None

    def enter(self) -> HttpResponseBase | None:
        deadline = None
        while True:
            if self.block is contextlib.nullcontext:
                outcome = self.begin_phase(self.request, self.options)  # nothing to hold open
            else:
                with contextlib.ExitStack() as stack:
                    stack.enter_context(self.block())
                    outcome = self.begin_phase(self.request, self.options)
                    if outcome is None or isinstance(outcome, Attempt):
                        self.stack = stack.pop_all()  # the view runs in the block
            if outcome is None or isinstance(outcome, Attempt):
                self.attempt = outcome
                return None
            if isinstance(outcome, HttpResponseBase):
                return outcome
            deadline = deadline or time.monotonic() + outcome.seconds
            remaining = deadline - time.monotonic()
            if remaining <= 0 or open_transactions():
                # Waiting would hold a transaction someone else opened: answer now.
                return outcome.conflict()
            if not outcome.wait(remaining):
                return outcome.conflict()  # too many waiters already: 409 at once

    def exit(self, response: HttpResponseBase) -> HttpResponseBase:
        """The view answered: store the answer or release the key, then close the block."""
        try:
            with self.stack or contextlib.nullcontext():
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
                if self.stack is not None:
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


# -- phase 1 --------------------------------------------------------------------


#: The key of a keyless request under a view's ``window``: this, then its fingerprint.
WINDOW_KEY_PREFIX = "window:"


def begin(
    request: HttpRequest,
    options: ViewOptions = ViewOptions(),
    *,
    read_key: Callable[[HttpRequest], str | None] | None = None,
) -> Attempt | Busy | HttpResponseBase | None:
    """Decide what a request gets before its view runs.

    None: not a protected request (a safe method, no key, an anonymous
    principal under ``ANONYMOUS="ignore"``): run the view as usual. A
    response: send it and do not run the view (a replay, a conflict, a bad
    key, the store down). An :class:`Attempt`: the key is claimed for this
    request; run the view, then ``finish`` or ``abort`` the attempt. A
    :class:`Busy`: another request holds the key and the view waits for it
    (``WAIT_FOR_IN_PROGRESS``); :func:`run` handles it.

    ``read_key`` reads the raw key where a door keeps it other than in the ``HEADER``
    header (a GraphQL mutation's argument); None from it: the request has no key.
    """
    settings = idempotency_settings
    django = getattr(request, "_request", request)  # where the request's marks are
    if (
        not settings.ENABLED
        or django.method not in settings.METHODS
        or getattr(django, ACTIVE_ATTRIBUTE, False)
    ):
        return None
    raw_key = key_header(request, settings.HEADER) if read_key is None else read_key(request)
    key: str | None = None
    if raw_key is None:
        if option(options.required, settings.REQUIRED):
            return refuse(request, problems.KEY_MISSING)
        if options.window is None:
            return None
        # The duplicate window: the request's fingerprint will be its key, in the
        # scope of an authenticated principal only (never a guest's session).
        scope = function(options.scope, settings.SCOPE_FUNCTION)(request)
        if scope is None:
            return None
    else:
        setattr(django, DECISION_ATTRIBUTE, "protected")
        try:
            key = parse_key(raw_key)
        except InvalidKey as exc:
            return reject(request, problems.KEY_INVALID, detail=exc.translated(gettext))
        scope = scope_of(request, options)
    if scope is None:
        if settings.ANONYMOUS == "reject":
            return reject(request, problems.AUTHENTICATION_REQUIRED)
        log(logging.INFO, "unprotected", request, reason="anonymous")
        decide(request, "anonymous")
        return None
    if len(scope.location) > MAX_LOCATION_LENGTH or not scope.location.isprintable():
        return reject(
            request,
            problems.LOCATION_INVALID,
            header=settings.LOCATION_HEADER,
            length=MAX_LOCATION_LENGTH,
        )
    try:
        if not getattr(django, PREPARED_ATTRIBUTE, False):  # most were, by the middleware
            prepare_body(request)
        fingerprint = (
            settings.FINGERPRINT_FUNCTION
            if options.fingerprint is None
            else function(options.fingerprint, None)
        )(request)
    except (RawPostDataException, BodyRefused) as exc:
        if key is None:
            return None  # a keyless request the window cannot hold runs as it would without
        if isinstance(exc, BodyRefused):
            return exc.refusal(request)
        return reject(request, problems.BODY_UNAVAILABLE)
    window = None
    if key is None:
        decide(request, "protected")
        # Hashed: a project's fingerprint function may return more than a key holds.
        digest = hashlib.sha256(fingerprint.encode()).hexdigest()
        key, window = WINDOW_KEY_PREFIX + digest, options.window
    info = RequestInfo(
        method=str(django.method),
        path=django.path,
        fingerprint=fingerprint,
        request_id=request_id(request) if settings.REQUEST_ID_HEADER else "",
    )
    key_in_scope = RecordKey(scope.principal, scope.location, key)
    attempt = Attempt(request, key_in_scope, info, options, window)
    outcome = attempt.claim()
    if isinstance(outcome, HttpResponseBase) and settings.MARKER_HEADERS.key_echo:
        attempt.echo_key(outcome)
    return outcome


def work_interrupted(request: HttpRequest, error: Exception) -> None:
    """DRF's or ninja's exception handler answered ``error``, which interrupted the work.

    What the work wrote must not commit, as Django's ``ATOMIC_REQUESTS`` block
    rolls back around a view that raised: the transactions open around it are
    marked for rollback, as DRF's own handler does (``atomic``'s too, with the
    claim in it: its key is then given back), and a retain function sees ``error``.
    """
    roll_back_open_transactions()
    note_handled_exception(request, error)


def mark_ignored_key(
    request: HttpRequest, response: HttpResponseBase, unprotected: bool = True
) -> None:
    """Tell the client of a keyed unsafe request whose key was not used (its KEY_IGNORED marker).

    The middleware calls it after the view for every keyed unsafe request: one
    no part of the library took charge of is "unprotected" (the first of each
    route is logged at WARNING). :class:`Protection` calls it for the requests
    it let through (``unprotected=False``): "anonymous" ones.
    """
    settings = idempotency_settings
    name = settings.MARKER_HEADERS.key_ignored
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
