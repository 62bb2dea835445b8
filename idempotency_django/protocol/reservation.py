"""The key protocol every door goes through: :class:`KeyReservation`.

A request (:class:`~idempotency_django.protocol.attempt.Attempt`, and the webhooks'
delivery), and a background task's run (:class:`~idempotency_django.tasks.TaskRun`)
hold their key the same way:

1. :meth:`~KeyReservation.take` claims it. Claimed outside the work's
   transactions, its completion is hooked on their commit now, ahead of any
   hook the work adds: a hook of the work that raises or dies after the
   COMMIT cannot skip it. Committed on its own, it is renewed by the
   heartbeat (``HEARTBEAT``) while its fate is open.
2. The work runs.
3. :meth:`~KeyReservation.settle` keeps its answer: stored now when there is
   no transaction or the claim joined the only one, else renewed, and stored
   once every transaction around the work has committed. A reservation lost
   meanwhile, or a store that cannot say, marks the work for rollback.
   :meth:`~KeyReservation.release` gives the key back instead (the work
   failed), and :meth:`~KeyReservation.commit_failed` when the COMMIT did.

Each step is logged, and a request's signalled (the holder says how).
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from enum import Enum
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.dispatch import Signal

from idempotency_django import signals
from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.heartbeat import Beat, start_beat
from idempotency_django.protocol.logs import error_name
from idempotency_django.protocol.transactions import open_transactions, roll_back, will_roll_back
from idempotency_django.stores import (
    Claim,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
    get_store,
)


class Settled(Enum):
    """What :meth:`KeyReservation.settle` did with the work's answer."""

    #: Stored, or to be stored when the work commits (or gone with its rollback).
    KEPT = "kept"
    #: Taken over after ``LOCK_TIMEOUT``: the work is marked for rollback.
    LOST = "lost"
    #: The store failed: whether the key is still ours cannot be told; the work
    #: is marked for rollback.
    UNAVAILABLE = "unavailable"


class KeyReservation(ABC):
    """A key claimed in the store, until it is completed or released.

    It keeps the store, the heartbeat and the transactions around the work in
    step; the holder decides what the work is and which answer it keeps. It
    needs no request.
    """

    def __init__(self, key: RecordKey, info: RequestInfo, retention: int) -> None:
        self.key = key
        self.info = info
        #: Seconds the answer is kept for replay.
        self.retention = retention
        #: Read once: the claim, the renewals and the waits of one reservation agree.
        self.lock_timeout: int = idempotency_settings.LOCK_TIMEOUT
        self.store = get_store()
        self.digest = key.digest[:16]  # keys.key_digest(), computed once
        self.token = ""
        #: The databases with a transaction open around the work when the key was
        #: claimed: the same until the work ends, so asked once.
        self.work: list[str] = []
        #: The claim joined a database transaction that is open around the work.
        self.joined_transaction = False
        #: ... and that transaction is the only one: the work and its record
        #: commit together (with several, the store is outside the work).
        self.in_transaction = False
        #: With HEARTBEAT: the renewal of a reservation committed on its own.
        self.beat: Beat | None = None
        #: The answer to store once the work's transactions have committed.
        self.deferred: StoredResponse | None = None
        #: The databases whose commit the deferred answer waits for.
        self.uncommitted: set[str] = set()
        #: The completion hooks waiting on those commits, with the connection
        #: (this thread's) whose ``run_on_commit`` holds each, by database.
        self.hooks: dict[str, tuple[BaseDatabaseWrapper, Any]] = {}

    # -- 1: take the key --

    def take(self) -> Claim:
        """Claim the key (raises :class:`StoreUnavailable`); when claimed, hook its completion.

        Hooked now, ahead of any hook the work adds to the transactions open
        around it: one of those that raises, or a process killed in one, after
        the COMMIT cannot skip the completion.
        """
        self.work = work = open_transactions()
        # A store outside the database (no alias) joins no transaction: not asked.
        alias = self.store.database_alias
        self.joined_transaction = alias is not None and self.store.joins_transaction()
        self.in_transaction = self.joined_transaction and work == [alias]
        claim = self.store.claim(self.key, self.info, self.lock_timeout)
        if claim.outcome is Outcome.CLAIMED:
            self.token = claim.token
            if work and not self.in_transaction:
                self.store_after_commit(work)
            if not self.joined_transaction and idempotency_settings.HEARTBEAT is not None:
                # Renewed only while its fate is open: see fate_open().
                self.beat = start_beat(
                    self.store, self.key, self.token, self.info, self.lock_timeout, self.fate_open
                )
        return claim

    # -- 3: settle --

    def settle(self, stored: StoredResponse, status: int | None = None) -> Settled:
        """Keep the work's answer: now, or once the transactions around the work commit."""
        work = self.work
        if self.in_transaction:
            # In the work's transaction: both commit, or neither does.
            return Settled.KEPT if self.complete(stored) else Settled.UNAVAILABLE
        if not work:
            self.complete(stored)
            return Settled.KEPT
        if any(will_roll_back(alias) for alias in work):
            self.release(status, "rollback")
            return Settled.KEPT
        # Renewed now, so that no retry can take the key over before the
        # commit: a holder that lost it rolls its work back.
        try:
            owned = self.store.renew(self.key, self.token, self.lock_timeout, self.info)
        except StoreUnavailable as exc:
            self.log(logging.ERROR, "store_failed", error=error_name(exc))
            self.stop_heartbeat()
            roll_back(work)
            return Settled.UNAVAILABLE
        if not owned:
            self.log(logging.WARNING, "lost_reservation", status=status)
            self.stop_heartbeat()
            roll_back(work)
            return Settled.LOST
        self.deferred = stored
        self.store_after_commit(work)
        return Settled.KEPT

    def store_after_commit(self, work: list[str]) -> None:
        """Store the deferred answer once each database of ``work`` has committed.

        Its hook runs first of the database's: Django takes the hooks out of
        ``run_on_commit`` before it runs them, so while a hook registered earlier
        (a caller's) ran, the heartbeat saw the transaction's fate settled and
        stopped, and one that ran past ``LOCK_TIMEOUT`` let a retry take over work
        that had committed; one that raised skipped the completion.
        """
        for alias in set(work) - self.uncommitted:
            self.uncommitted.add(alias)
            hook = functools.partial(self.committed, alias)
            connection = connections[alias]
            self.hooks[alias] = (connection, hook)
            transaction.on_commit(hook, using=alias, robust=True)
            connection.run_on_commit.insert(0, connection.run_on_commit.pop())

    def committed(self, alias: str) -> None:
        self.uncommitted.discard(alias)
        self.hooks.pop(alias, None)
        if self.uncommitted or self.deferred is None:
            return
        stored, self.deferred = self.deferred, None
        self.complete(stored)

    def commit_failed(self) -> None:
        """The transaction around the work ended in an exception: its work did not commit."""
        if self.deferred is not None:
            self.deferred = None
            self.release(None, "rollback")

    def fate_open(self) -> bool:
        """Whether the transactions the completion waits for are still open.

        Each hook stays in its connection's ``run_on_commit`` until that
        transaction commits; a rollback (of the transaction, or of the
        savepoint the claim was made in) or a failed COMMIT drops it, and
        Django runs nothing then. A reservation whose work was rolled back is
        renewed no longer: it expires ``LOCK_TIMEOUT`` after its last renewal
        instead of holding the key until ``MAX_RUN_TIME``. Read by the
        heartbeat's thread: the list is only read, never changed.
        """
        if not self.hooks:
            return True  # no transaction decides: the holder settles it
        return any(
            any(entry[1] is hook for entry in connection.run_on_commit)
            for connection, hook in list(self.hooks.values())
        )

    # -- settling with the store --

    def complete(self, stored: StoredResponse) -> bool:
        """Store the answer. False only when the claim's transaction must now roll back."""
        beat = self.beat
        if beat is not None:
            beat.settling = True  # a renewal racing this completion finds it settled
        try:
            owned = self.store.complete(
                self.key, self.token, stored, self.retention, request=self.info
            )
        except StoreUnavailable as exc:
            if beat is not None:
                beat.settling = False
            self.log(logging.ERROR, "store_failed", status=stored.status, error=error_name(exc))
            if self.in_transaction:
                # The work must not commit without its record: roll both back.
                self.roll_back()
                return False
            # The work is done and the client gets its answer. The key is not
            # released: retries get 409 in progress until LOCK_TIMEOUT.
            return True
        if beat is not None:
            beat.stop()
        if owned:
            self.log(logging.INFO, "stored", status=stored.status)
            if signals.stored.receivers:
                self.send(signals.stored, status=stored.status)
            return True
        # Taken over after LOCK_TIMEOUT by a retry, which owns the record now.
        self.log(logging.WARNING, "lost_reservation", status=stored.status)
        return True

    def release(self, status: int | None, reason: str, level: int = logging.INFO) -> None:
        """Give the key back; logged at ``level``: DEBUG when another record says why.

        Given up, released or not: a release that failed leaves the key to
        expire LOCK_TIMEOUT after the last renewal.
        """
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
        self.log(level, "released", status=status, reason=reason)
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
