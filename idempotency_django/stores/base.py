"""The interface every store implements.

A store answers three questions atomically: may this request run (claim),
here is its answer (complete), and never mind, let a retry run (release).
The rules about *which* answer to give live in :mod:`idempotency_django.protection`;
a store only keeps state.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from django.core.checks import CheckMessage


class StoreUnavailable(Exception):
    """The store could not be reached or failed; the request must not run."""


@dataclass(frozen=True)
class RecordKey:
    """Identifies one idempotency record: a key within a scope."""

    principal: str
    location: str
    key: str


@dataclass(frozen=True)
class StoredResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


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
    #: True when complete() can join the database transaction the view ran
    #: in, so the work and its stored response commit together.
    supports_atomic = False
    #: True when the store forgets expired entries by itself (e.g. Redis TTLs),
    #: so the purge command has nothing to do.
    expires_by_itself = False

    def __init__(self, **options: Any) -> None:
        self.options = options

    @abstractmethod
    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        """Reserve ``key`` for this request, or report what already holds it.

        CLAIMED when the key is free, expired, or held by a reservation older
        than ``lock_timeout`` seconds; REPLAY when a live completed record has
        the same fingerprint; REUSED when it has another; IN_PROGRESS when a
        live reservation holds it. Raises :class:`StoreUnavailable`.
        """

    def peek(self, key: RecordKey) -> Outcome | None:
        """What holds ``key`` now, without claiming it.

        REPLAY for a live completed entry, IN_PROGRESS for a live reservation,
        None when the key is free or expired. Used by webhook deduplication.
        """
        raise NotImplementedError

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

        Returns False when another request took the key over meanwhile (or
        the response was already stored). When the reservation is gone because
        it outlived its lock timeout and nobody claimed the key since (Redis
        expired it, a purge deleted it), the response is still stored if
        ``request`` is given: the work ran once, so a retry must replay it.
        """

    @abstractmethod
    def release(self, key: RecordKey, token: str) -> None:
        """Drop the reservation if ``token`` still owns it, so a retry runs."""

    def atomic(self) -> Any:
        """A context manager for the transaction complete() joins (stores with supports_atomic)."""
        raise NotImplementedError

    def in_transaction(self) -> bool:
        """True when complete() would join a transaction still open around the view."""
        return False

    def in_rolled_back_transaction(self) -> bool:
        """True when the work done so far will be rolled back."""
        return False

    def check(self) -> list[CheckMessage]:
        """System-check messages about this store's configuration."""
        return []
