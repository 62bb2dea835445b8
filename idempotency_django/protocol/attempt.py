"""Phase 1 and phase 2 of one protected request: :class:`Attempt`.

:func:`~idempotency_django.protocol.phases.begin` builds it; it claims the key (or
answers for a key already taken: a replay, a conflict, a
:class:`~idempotency_django.protocol.waiting.Busy` key to wait for), then, once the view
has answered, stores that answer for replay or gives the key back, at the
moment the transactions around the view allow (see
:mod:`~idempotency_django.protocol.phases`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from django.dispatch import Signal
from django.http import FileResponse, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from idempotency_django import signals
from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol import problems, transactions
from idempotency_django.protocol.logs import error_name, log, logger
from idempotency_django.protocol.marks import (
    ACTIVE_ATTRIBUTE,
    FINGERPRINT_ATTRIBUTE,
    HANDLED_EXCEPTION_ATTRIBUTE,
    KEY_ATTRIBUTE,
)
from idempotency_django.protocol.options import ViewOptions, function, option, scope_of
from idempotency_django.protocol.problems import refuse, replay_headers, replay_response
from idempotency_django.protocol.reservation import KeyReservation, Settled
from idempotency_django.protocol.retention import retain_client_errors, retain_successes
from idempotency_django.protocol.scope import principal_of
from idempotency_django.protocol.waiting import Busy
from idempotency_django.stores import (
    Claim,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
)

#: On a replay that the duplicate window made (the request carried no key): its seconds.
WINDOW_HEADER = "Idempotency-Window"


class Attempt(KeyReservation):
    """One claim of a key: :meth:`claim` it, then :meth:`finish` or :meth:`abort`.

    Subclasses change the answers (webhook deliveries answer duplicates with
    ``202``), never the order of the steps.
    """

    #: An answer from this status on is never kept, and its work is rolled back.
    ROLLED_BACK_FROM = 500

    def __init__(
        self,
        request: HttpRequest,
        key: RecordKey,
        info: RequestInfo,
        options: ViewOptions = ViewOptions(),
        window: int | None = None,
        *,
        retention: int | None = None,
    ) -> None:
        # Seconds the answer is kept: the door's own (a webhook delivery's), the
        # window's, the view's, else ``RETENTION``.
        if retention is None:
            retention = options.retention if window is None else window
        super().__init__(
            key, info, idempotency_settings.RETENTION if retention is None else retention
        )
        self.request = request
        #: The Django request under a DRF one, where the request's marks are set.
        self.django_request: HttpRequest = getattr(request, "_request", request)
        self.options = options
        #: For the logs: "first" or "takeover" once claimed; any request that
        #: finds the key held is a "retry" of the operation.
        self.attempt = "retry"
        #: Who the request was authenticated as when the key was claimed: the objects
        #: a principal is named from, ``user`` and DRF's or ninja's ``auth``. A view
        #: that authenticates someone else replaces one of them (``login()`` sets a
        #: new ``request.user``): only then is the scope computed again.
        self.authenticated_as: tuple[Any, Any, Any] = (None, None, None)
        #: The view's window, when the request carried no key and its fingerprint is it.
        self.window = window

    def send(self, signal: Signal, **kwargs: Any) -> None:
        if signal.receivers and signal.has_listeners(type(self.store)):
            signal.send(
                sender=type(self.store), request=self.request, key_digest=self.digest, **kwargs
            )

    def log(self, level: int, event: str, **fields: Any) -> None:
        if logger.isEnabledFor(level):  # a DEBUG step costs nothing more when off
            log(level, event, self.request, key_digest=self.digest, attempt=self.attempt, **fields)

    # -- phase 1: claim --

    def claim(self) -> Attempt | Busy | HttpResponseBase:
        """Claim the key: this attempt when it is ours, else the answer to send."""
        try:
            claim = self.take()
        except StoreUnavailable as exc:
            self.log(logging.ERROR, "unavailable", error=error_name(exc))
            self.send(signals.unavailable, error=exc)
            self.roll_back()
            return self.unavailable()
        if claim.outcome is not Outcome.CLAIMED:
            return self.held(claim)
        self.attempt = "takeover" if claim.took_over else "first"
        request = self.request
        self.authenticated_as = (
            getattr(request, "user", None),
            getattr(self.django_request, "user", None),
            getattr(request, "auth", None),
        )
        if idempotency_settings.MAX_KEYS_PER_PRINCIPAL:
            too_many = self.over_key_limit()
            if too_many is not None:
                return too_many
        # DEBUG: the request's one INFO record is its outcome. Asked here as well as in
        # log(), so that a first request makes no call for a record that is off.
        if logger.isEnabledFor(logging.DEBUG):
            self.log(logging.DEBUG, "reserved")
        if signals.reserved.receivers:
            self.send(signals.reserved)
        django = self.django_request
        setattr(django, ACTIVE_ATTRIBUTE, True)
        if self.window is None:
            # downstream_key()'s: a window's key is its body's, and two deliberate
            # orders after the window would share one, and their provider's answer.
            setattr(django, KEY_ATTRIBUTE, self.key)
            setattr(django, FINGERPRINT_ATTRIBUTE, self.info.fingerprint)
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
        lifetime = self.lock_timeout + self.retention
        try:
            count, first_expiry = self.store.count_keys(self.key, lifetime)
        except StoreUnavailable as exc:
            self.log(logging.ERROR, "unavailable", error=error_name(exc))
            self.release(None, "unavailable", logging.DEBUG)
            return self.unavailable()
        if count <= limit:
            return None
        self.release(None, "too_many_keys", logging.DEBUG)  # "rejected" is its record
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
            if self.window is not None:
                replay[WINDOW_HEADER] = str(self.window)  # not a key's replay: the window's
            hook = idempotency_settings.REPLAY_HOOK
            return hook(self.request, replay) if hook is not None else replay
        if claim.outcome is Outcome.REUSED:
            self.log(logging.INFO, "conflict", code=problems.KEY_REUSED)
            self.send(signals.conflict, code=problems.KEY_REUSED)
            return refuse(self.request, problems.KEY_REUSED)
        seconds = option(
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
        """Name the key on the answer when ``MARKER_HEADERS["KEY_ECHO"]`` asks for it."""
        header = idempotency_settings.MARKER_HEADERS.key_echo
        if header and self.window is None:  # a window's key is no key the client sent
            response[header] = self.key.key

    def finish(self, response: HttpResponseBase) -> HttpResponseBase:
        """Store the view's response for replay, or release the key; return what to send.

        One pass: whether the answer may be kept (:meth:`release_reason`), whether
        its work rolls back, then the store. Whatever raises here (a view that
        returned no response, a lazy response that fails to render) aborts the
        attempt: the key is not left reserved for work whose answer nobody got.
        """
        setattr(self.django_request, ACTIVE_ATTRIBUTE, False)
        try:
            if not isinstance(response, HttpResponseBase):
                raise TypeError(
                    f"The view protected by idempotency_django returned {type(response).__name__}, "
                    "not a Django response. On a django-ninja operation, use "
                    "idempotency_django.ninja.idempotent."
                )
            status = response.status_code
            reason = self.release_reason(response)
            if status >= self.ROLLED_BACK_FROM:
                # Never kept, so the retry runs: its work must not commit either,
                # whatever made the answer so (the view, a middleware after this
                # one, a template that failed to render).
                transactions.roll_back(self.work)
            answer = response
            if self.joined_transaction and self.rolled_back():
                # The reservation goes with the claim's transaction: nothing to
                # store, nothing to release.
                self.log(logging.INFO, "released", status=status, reason="rollback")
            elif reason is not None:
                self.release(status, reason)
            else:
                settled = self.settle(self.stored_response(response), status)
                if settled is Settled.LOST:
                    answer = self.in_progress()
                elif settled is Settled.UNAVAILABLE:
                    answer = self.unavailable()
        except BaseException as error:
            self.abort(error)
            raise
        if idempotency_settings.MARKER_HEADERS.key_echo:
            self.echo_key(answer)
        return answer

    def abort(self, error: BaseException | None = None) -> None:
        """The view raised: let a retry run, unless the view was only cancelled.

        A cancelled view (its client hung up, under ASGI) may have written
        and may still commit: its reservation is kept until ``LOCK_TIMEOUT``
        (with ``HEARTBEAT``, renewed until its ``MAX_RUN_TIME``), or goes with the
        claim's transaction if that rolls back.
        """
        setattr(self.django_request, ACTIVE_ATTRIBUTE, False)
        if self.rolled_back():
            return  # the reservation goes with the rollback
        if isinstance(error, asyncio.CancelledError):
            self.log(logging.WARNING, "cancelled")
            return
        self.release(None, "exception")

    def release_reason(self, response: HttpResponseBase) -> str | None:
        """Why ``response`` must not be stored, or None to store it.

        Never a streamed answer or a 5xx. Nor one of a view that authenticated
        someone else than the key was claimed for (a session-scoped claim whose
        view then took a token of its own, or logged in): stored under the first
        principal, it would be served to them. Then the view's own choice (its
        ``retain`` function, then its ``retain_client_errors``), then the
        project's ``RETAIN_FUNCTION``.
        """
        if response.streaming or isinstance(response, FileResponse):
            return "streaming"
        if response.status_code >= 500:
            return "server_error"
        options, request, then = self.options, self.request, self.authenticated_as
        session_user = getattr(self.django_request, "user", None)
        if (
            getattr(request, "user", None) is not then[0]
            or session_user is not then[1]
            or getattr(request, "auth", None) is not then[2]
        ):
            # Who the scope is made of was replaced: the same principal, or another?
            scope = scope_of(request, options)
            principal = None if scope is None else scope.principal
            if (
                principal == self.key.principal
                and session_user is not then[1]
                and principal_of(then[1]) == principal
            ):
                # The key's principal was the session's user, and the view logged
                # someone else in: a door whose scope reads another object (ninja's
                # request.auth, still who it authenticated) would store their answer
                # under the first.
                principal = principal_of(session_user) or principal
            if principal is not None and principal != self.key.principal:
                self.log(logging.WARNING, "principal_changed")
                return "principal_changed"
        if options.retain_client_errors is not None and options.retain is None:
            chosen = retain_client_errors if options.retain_client_errors else retain_successes
            return None if chosen(request, response, None) else "not_retained"
        retain = (
            idempotency_settings.RETAIN_FUNCTION
            if options.retain is None
            else function(options.retain, None)
        )
        handled = getattr(self.django_request, HANDLED_EXCEPTION_ATTRIBUTE, None)
        try:
            kept = bool(retain(request, response, handled))
        except Exception as exc:
            # The work is done: failing the request now would free its key
            # and run it again. The default table decides instead.
            self.log(logging.ERROR, "retain_failed", error=type(exc).__name__)
            kept = retain_successes(request, response, handled)
        return None if kept else "not_retained"

    def stored_response(self, response: HttpResponseBase) -> StoredResponse:
        """What is kept for replay: the bytes the client gets, rendered first if lazy.

        A body over ``MAX_STORED_BODY`` is not kept: only that the request ran,
        and its status, so that a retry neither runs again nor gets a replay.
        """
        if not getattr(response, "is_rendered", True):
            response.render()  # type: ignore[attr-defined]
        assert isinstance(response, HttpResponse)
        body = response.content
        limit = self.options.max_stored_body
        if limit is None:
            limit = idempotency_settings.MAX_STORED_BODY
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
