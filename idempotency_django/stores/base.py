"""The interface every store implements.

A store answers three questions atomically: may this request run (claim),
here is its answer (complete), and never mind, let a retry run (release).
The rules about *which* answer to give live in :mod:`idempotency_django.protocol.attempt`;
a store only keeps state. Times are the store's own: the database's clock
or Redis's TTLs, never an app server's.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.core.checks import CheckMessage
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.functional import cached_property

from idempotency_django.stores.digests import record_digest


def backoff() -> Iterator[float]:
    """Pauses between looks at a held key: 20 ms, doubling, at most 250 ms."""
    pause = 0.02
    while True:
        yield pause
        pause = min(pause * 2, 0.25)


class StoreUnavailable(Exception):
    """The store could not be reached or failed; the request must not run."""


class unavailable_on:  # named as it is used: `with unavailable_on(Error):`
    """The one translation of a store's failures: ``errors`` become StoreUnavailable.

    A class, not ``@contextlib.contextmanager``: every statement of a store runs in
    one, and a generator's context manager costs several times more (issue 36).
    """

    __slots__ = ("errors",)

    def __init__(self, *errors: type[Exception]) -> None:
        self.errors = errors

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: Any
    ) -> None:
        if exc is not None and isinstance(exc, self.errors):
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc


def in_request_transaction(connection: BaseDatabaseWrapper) -> bool:
    """In a transaction other than the one a Django TestCase wraps each test in.

    The one reader of Django's private ``_from_testcase`` mark: should Django rename it,
    one line changes (``protocol/transactions.py`` may ask here; stores never import it).
    """
    blocks = connection.atomic_blocks  # most often none: no generator made then
    return bool(blocks) and any(not getattr(block, "_from_testcase", False) for block in blocks)


@dataclass(frozen=True)
class RecordKey:
    """Identifies one idempotency record: a key within a scope."""

    principal: str
    location: str
    key: str

    # Django's cached_property: on Python 3.11 functools' takes a lock that every instance
    # shares, so threads computing a key's digest wait for each other (and it costs 3x).
    @cached_property
    def digest(self) -> str:
        """What stores find the record by: :func:`~.digests.record_digest`."""
        return record_digest(self.principal, self.location, self.key)


@dataclass(frozen=True)
class StoredResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    #: The request ran, but its response was larger than ``MAX_STORED_BODY``:
    #: only the status is kept, and a retry is told so instead of a replay.
    body_omitted: bool = False


@dataclass(frozen=True)
class KeyState:
    """What a store holds for a key, without the stored response's body."""

    #: "in_progress" (a reservation) or "completed".
    state: str
    #: The stored response's status; None for a reservation.
    status: int | None
    #: Seconds until the entry expires, by the store's own clock.
    expires_in: float


class Outcome(enum.Enum):
    CLAIMED = "claimed"
    REPLAY = "replay"
    REUSED = "reused"
    IN_PROGRESS = "in_progress"


@dataclass(frozen=True)
class Claim:
    outcome: Outcome
    #: Proof of ownership for complete()/release(), set when CLAIMED.
    token: str = ""
    #: The stored answer, set when REPLAY.
    response: StoredResponse | None = None
    #: CLAIMED by taking over a reservation abandoned past its lock timeout
    #: (stores that can tell; an expired Redis key is simply gone).
    took_over: bool = False


@dataclass(frozen=True)
class RequestInfo:
    """Non-secret facts about the request, kept for inspection."""

    method: str
    path: str
    fingerprint: str
    request_id: str = ""
    #: "request" for the key contract, "webhook" for delivery deduplication.
    kind: str = "request"
    #: Where a webhook delivery's identity came from.
    source: str = ""


class BaseStore(ABC):
    """Where reservations and stored responses live: one interface, several stores.

    Name a subclass by dotted path in ``IDEMPOTENCY["STORE"]``; its
    ``STORE_OPTIONS`` are passed to ``__init__``. Every method is atomic on
    its own and raises ``StoreUnavailable`` when the store fails; times
    are the store's own clock.
    """

    #: The database alias whose transactions the store's writes join, so the
    #: work and its stored response commit (or roll back) together; None
    #: for a store outside the database.
    database_alias: str | None = None
    #: True when the store forgets expired entries by itself (e.g. Redis TTLs),
    #: so the purge command has nothing to do.
    expires_by_itself = False
    #: True when the store implements :meth:`count_keys`; ``MAX_KEYS_PER_PRINCIPAL``
    #: applies only then (a store of a project's own need not count).
    counts_keys = False

    def __init__(self, **options: Any) -> None:
        self.options = options

    @abstractmethod
    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        """Reserve ``key`` for this request, or report what already holds it.

        CLAIMED when the key is free, expired, or held by a reservation older
        than ``lock_timeout`` seconds; REPLAY when a live completed record has
        the same fingerprint; REUSED when it has another; IN_PROGRESS when a
        live reservation holds it. Raises ``StoreUnavailable``.
        """

    @abstractmethod
    def complete(
        self,
        key: RecordKey,
        token: str,
        response: StoredResponse,
        retention: int,
        *,
        request: RequestInfo | None = None,
    ) -> bool:
        """Store the response for ``retention`` seconds if ``token`` still owns the key.

        Returns False when another request owns the key (it took an expired
        reservation over) or the response was already stored: a completion
        never overwrites a record another request owns. When the key has no
        entry at all (Redis expired the reservation, a purge deleted it) and
        ``request`` is given, the response is stored anyway: the work ran
        once and nobody else has claimed the key, so a retry must replay it.
        """

    @abstractmethod
    def release(self, key: RecordKey, token: str) -> None:
        """Drop the reservation if ``token`` still owns it, so a retry runs."""

    @abstractmethod
    def renew(
        self,
        key: RecordKey,
        token: str,
        lock_timeout: int,
        request: RequestInfo,
        *,
        remake: bool = True,
    ) -> bool:
        """Keep the reservation ``lock_timeout`` more seconds if ``token`` still owns it.

        Called just before the view's transaction commits when the store is
        not part of it. False when another request took the key over: the
        work must then roll back. A reservation that expired without anyone
        claiming the key since is made again, as
        [`complete`][idempotency_django.stores.base.BaseStore.complete] would,
        unless ``remake`` is False: the heartbeat only extends a reservation
        that is still there (one released meanwhile must stay released). With
        ``remake=False`` it must not wait for another transaction's lock on the
        key (a retry taking it over in its transaction): it raises
        ``StoreUnavailable`` instead, and the heartbeat tries at its next beat,
        so that one renewal never holds up its process's others.
        """

    @abstractmethod
    def lookup(self, key: RecordKey) -> KeyState | None:
        """The live entry of ``key``, or None (free or expired): state, status, expiry."""

    def peek(self, key: RecordKey) -> Outcome | None:
        """What holds ``key`` now, without claiming it: read from ``lookup(key)``.

        REPLAY for a live completed entry, IN_PROGRESS for a live reservation,
        None when the key is free or expired. Used by webhook deduplication.
        """
        entry = self.lookup(key)
        if entry is None:
            return None
        return Outcome.REPLAY if entry.state == "completed" else Outcome.IN_PROGRESS

    def is_held(self, key: RecordKey) -> bool:
        """True while a request that is still running holds ``key``."""
        return self.peek(key) is Outcome.IN_PROGRESS

    def wait(self, key: RecordKey, timeout: float) -> None:
        """Return once ``key`` is no longer held by a running request, or after ``timeout``.

        For ``WAIT_FOR_IN_PROGRESS``. This one looks at the store again and
        again, with growing pauses; a store that can be told when a key
        settles overrides it. Never called inside a transaction.
        """
        deadline = time.monotonic() + timeout
        for pause in backoff():
            if not self.is_held(key) or (remaining := deadline - time.monotonic()) <= 0:
                return
            time.sleep(min(pause, remaining))

    def count_keys(self, key: RecordKey, lifetime: int) -> tuple[int, float | None]:
        """For ``MAX_KEYS_PER_PRINCIPAL``: how many live keys ``key``'s principal holds.

        Called right after ``key`` was claimed (it counts), with the longest
        it may live (``lifetime`` seconds). Returns the count and the seconds
        until the first of those keys expires.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot count keys per principal.")

    def clear(self) -> None:
        """Delete every reservation and stored response of this store (for tests).

        ``idempotency_django.testing.clear_store`` and its fixture call it.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot be cleared: give it a clear().")

    def joins_transaction(self) -> bool:
        """True when a claim now would join a database transaction open around the view.

        The reservation, the view's writes and the stored response then commit
        or roll back together.
        """
        return False

    def check(self) -> list[CheckMessage]:
        """System-check messages about this store's configuration."""
        return []
