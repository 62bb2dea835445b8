"""The reservation an :class:`~idempotency_django.attempt.Attempt` or a task's run holds on its key.

Settled once: completed (the answer stored for replay) or released (a retry
may run). Until then the heartbeat (``HEARTBEAT``) renews it when it committed
on its own; when the claim joined a transaction, it goes with that
transaction's rollback. Each step is logged, and a request's signalled.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any

from django.db import connections, transaction
from django.dispatch import Signal
from django.http import HttpRequest

from idempotency_django import signals
from idempotency_django.conf import idempotency_settings
from idempotency_django.heartbeat import Beat
from idempotency_django.logs import log
from idempotency_django.options import ViewOptions, option
from idempotency_django.stores import (
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
    get_store,
)


class KeyReservation(ABC):
    """A key claimed in the store, until it is completed or released.

    It keeps the store, the heartbeat and the claim's transaction in step;
    the holder claims the key and decides which answer it is settled with.
    It needs no request: a task's run (:class:`~idempotency_django.tasks.TaskRun`)
    holds one, and a request's is a :class:`Reservation`.
    """

    def __init__(self, key: RecordKey, info: RequestInfo) -> None:
        self.key = key
        self.info = info
        self.store = get_store()
        self.digest = key.digest[:16]  # keys.key_digest(), computed once
        self.token = ""
        #: The claim joined a database transaction that is open around the work.
        self.joined_transaction = False
        #: ... and that transaction is the only one: the work and its record
        #: commit together (with several, the store is outside the work).
        self.in_transaction = False
        #: With HEARTBEAT: the renewal of a reservation committed on its own.
        self.beat: Beat | None = None

    @abstractmethod
    def retention(self) -> int:
        """Seconds the answer is kept for replay."""

    def lock_timeout(self) -> int:
        return idempotency_settings.LOCK_TIMEOUT

    def complete(self, stored: StoredResponse) -> bool:
        """Store the answer. False only when the claim's transaction must now roll back."""
        try:
            owned = self.store.complete(
                self.key, self.token, stored, self.retention(), request=self.info
            )
        except StoreUnavailable as exc:
            self.log(logging.ERROR, "store_failed", status=stored.status, error=error_name(exc))
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
                error=error_name(exc),
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

    @abstractmethod
    def send(self, signal: Signal, **kwargs: Any) -> None:
        """Send ``signal`` for this reservation."""

    @abstractmethod
    def log(self, level: int, event: str, **fields: Any) -> None:
        """Log ``event`` of this reservation, never its key."""


class Reservation(KeyReservation):
    """A request's reservation: logged with the request, and signalled.

    :class:`~idempotency_django.attempt.Attempt` claims it and decides which
    answer it is settled with.
    """

    def __init__(
        self,
        request: HttpRequest,
        key: RecordKey,
        info: RequestInfo,
        options: ViewOptions = ViewOptions(),
    ) -> None:
        super().__init__(key, info)
        self.request = request
        self.options = options
        #: For the logs: "first" or "takeover" once claimed; any request that
        #: finds the key held is a "retry" of the operation.
        self.attempt = "retry"

    def retention(self) -> int:
        return option(self.options.retention, idempotency_settings.RETENTION)

    def send(self, signal: Signal, **kwargs: Any) -> None:
        if signal.receivers and signal.has_listeners(type(self.store)):
            signal.send(
                sender=type(self.store), request=self.request, key_digest=self.digest, **kwargs
            )

    def log(self, level: int, event: str, **fields: Any) -> None:
        log(level, event, self.request, key_digest=self.digest, attempt=self.attempt, **fields)


def error_name(exc: StoreUnavailable) -> str:
    return type(exc.__cause__ or exc).__name__
