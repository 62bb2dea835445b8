"""The retry decision: which outcome of an attempt is retried, and after how long.

A pure function of its inputs (the jitter is passed in), so the retry matrix of
docs/clients.md is this module, read and tested in one place.
"""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

# The server's problem codes (docs/errors.md; idempotency_django.protocol.problems on the
# server), written here so that a client needs no Django.
PROBLEM_CONTENT_TYPE = "application/problem+json"
KEY_IN_PROGRESS = "idempotency_key_in_progress"
KEY_REUSED = "idempotency_key_reused"
UNAVAILABLE = "idempotency_unavailable"
#: The server's IGNORED_KEY_HEADER: the key of this request was not used.
IGNORED_KEY_HEADER = "Idempotency-Key-Ignored"


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try one operation.

    ``attempts`` caps the requests sent (the first included), but for answers
    ``409 idempotency_key_in_progress``, which ran nothing, and ``max_elapsed`` the
    seconds from the first attempt: a wait that would end past it is not taken.
    Between attempts the wait is ``Retry-After`` when the server sent one, otherwise
    exponential backoff with full jitter: a random time in
    ``[0, min(cap, base * 2 ** (attempt - 1)))``, so workers that failed together do
    not retry together.
    """

    attempts: int = 5
    max_elapsed: float = 30.0
    base: float = 0.5
    cap: float = 8.0
    #: Retried besides ``409 idempotency_key_in_progress``: the server either did not
    #: run the request or did not keep its answer (5xx is never stored).
    retry_statuses: frozenset[int] = frozenset({408, 429, 500, 502, 503, 504})

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if min(self.max_elapsed, self.base, self.cap) < 0:
            raise ValueError("max_elapsed, base and cap must not be negative")

    def backoff(self, attempt: int, draw: float) -> float:
        """The wait after ``attempt`` (1-based) failed; ``draw`` is uniform in [0, 1)."""
        ceiling = min(self.cap, self.base * 2.0 ** min(attempt - 1, 64))  # 2**1024 overflows
        return draw * ceiling


@dataclass(frozen=True)
class Outcome:
    """What one attempt came back with.

    ``status`` is None when there was no response at all: the connection failed,
    was dropped or timed out, so the request may or may not have run.
    """

    status: int | None
    code: str | None = None
    retry_after: float | None = None
    #: Why the server did not use the key (its ``Idempotency-Key-Ignored``), if it said so.
    key_ignored: str | None = None

    @property
    def in_progress(self) -> bool:
        """``409 idempotency_key_in_progress``: another attempt holds the key; nothing ran."""
        return self.status == 409 and self.code == KEY_IN_PROGRESS


class Verdict(Enum):
    DONE = "done"  # a final answer (2xx, a replay, 3xx): return it
    RETRY = "retry"  # wait, then send the same request with the same key
    REAUTHENTICATE = "reauthenticate"  # 401: exchange the credential, then retry once
    REJECTED = "rejected"  # the same request cannot succeed: fix it or reconcile
    EXHAUSTED = "exhausted"  # retryable, but the attempts or the time budget ran out


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    delay: float = 0.0


def decide(
    outcome: Outcome,
    *,
    attempt: int,
    elapsed: float,
    policy: RetryPolicy,
    draw: float,
    can_reauthenticate: bool = False,
    counted: int | None = None,
) -> Decision:
    """The client retry matrix, for the ``attempt``-th attempt, ``elapsed`` seconds in.

    ``counted``: of those attempts, the ones ``policy.attempts`` caps (all but those
    answered "in progress", which ran nothing); by default ``attempt``.

    ``draw`` (uniform in [0, 1)) is the jitter, passed in so that the decision is
    repeatable. No retry is decided for a 400, 403, 404, 413, 422 or a 409 other
    than in progress (``idempotency_key_reused``): sending the same request again
    would get the same answer, and a new key would hide a real conflict. Nor for
    an answer whose ``Idempotency-Key-Ignored`` says the server did not use the
    key (but a 401, which ran nothing): a retry could run the work twice.
    """
    status = outcome.status
    in_progress = outcome.in_progress
    if status is not None and status < 400:
        return Decision(Verdict.DONE)
    if outcome.key_ignored is not None and status != 401:
        # The server did not use the key: a retry could run the operation twice.
        return Decision(Verdict.REJECTED)
    if status == 401:
        if not can_reauthenticate:
            return Decision(Verdict.REJECTED)
        verdict, delay = Verdict.REAUTHENTICATE, 0.0
    elif status is None or status in policy.retry_statuses or in_progress:
        verdict = Verdict.RETRY
        # No wait asked for, or none at all ("0", a date past): the backoff's own, or
        # every answer "in progress" would be asked again at once.
        delay = outcome.retry_after or policy.backoff(attempt, draw)
    else:
        return Decision(Verdict.REJECTED)
    # A Retry-After longer than the time left is not shortened: retrying before the
    # server asked would only be refused again. An answer "in progress" ran nothing:
    # only the time budget bounds those, so that a crashed request's key, free
    # LOCK_TIMEOUT after its last renewal (seconds with the server's HEARTBEAT), is
    # taken over within it.
    out_of_attempts = (attempt if counted is None else counted) >= policy.attempts
    out_of_attempts = out_of_attempts and not in_progress
    if out_of_attempts or elapsed + delay > policy.max_elapsed:
        return Decision(Verdict.EXHAUSTED)
    return Decision(verdict, delay)


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delay-seconds or an HTTP-date)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, with no claim about the local zone
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())
