"""The retry decision as a table (docs/clients.md's matrix), the backoff and the caps.

They are pure functions of their inputs, so they are tested with chosen inputs.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from idempotency_client import (
    KEY_IN_PROGRESS,
    KEY_REUSED,
    UNAVAILABLE,
    Decision,
    Outcome,
    RetryPolicy,
    Verdict,
    decide,
    parse_retry_after,
)

# -- the decision -----------------------------------------------------------------

POLICY = RetryPolicy(attempts=5, max_elapsed=30.0, base=0.5, cap=8.0)
BACKOFF = POLICY.backoff(1, 0.5)  # 0.25: what a row without Retry-After waits

RETRY, DONE, REJECTED, EXHAUSTED = Verdict.RETRY, Verdict.DONE, Verdict.REJECTED, Verdict.EXHAUSTED

#: Each row of the retry matrix on docs/clients.md: what an attempt got, what to do.
MATRIX = [
    pytest.param(Outcome(None), Decision(RETRY, BACKOFF), id="network error"),
    pytest.param(Outcome(201), Decision(DONE), id="201"),
    pytest.param(Outcome(200), Decision(DONE), id="200 replayed"),
    pytest.param(Outcome(204), Decision(DONE), id="204 replayed"),
    pytest.param(
        Outcome(409, KEY_IN_PROGRESS, 1.0),
        Decision(RETRY, 1.0),
        id="409 in progress, Retry-After",
    ),
    pytest.param(
        Outcome(409, KEY_IN_PROGRESS),
        Decision(RETRY, BACKOFF),
        id="409 in progress, no Retry-After",
    ),
    pytest.param(Outcome(429, None, 2.0), Decision(RETRY, 2.0), id="429, Retry-After"),
    pytest.param(Outcome(429), Decision(RETRY, BACKOFF), id="429, no Retry-After"),
    pytest.param(Outcome(408), Decision(RETRY, BACKOFF), id="408"),
    pytest.param(Outcome(500), Decision(RETRY, BACKOFF), id="500"),
    pytest.param(Outcome(502), Decision(RETRY, BACKOFF), id="502"),
    pytest.param(Outcome(503), Decision(RETRY, BACKOFF), id="503"),
    pytest.param(Outcome(503, UNAVAILABLE, 5.0), Decision(RETRY, 5.0), id="503 unavailable"),
    pytest.param(Outcome(504), Decision(RETRY, BACKOFF), id="504"),
    pytest.param(Outcome(401), Decision(REJECTED), id="401"),
    pytest.param(Outcome(400), Decision(REJECTED), id="400"),
    pytest.param(Outcome(400, "idempotency_key_invalid"), Decision(REJECTED), id="400 invalid key"),
    pytest.param(Outcome(403), Decision(REJECTED), id="403"),
    pytest.param(Outcome(404), Decision(REJECTED), id="404"),
    pytest.param(Outcome(409, KEY_REUSED), Decision(REJECTED), id="409 reused"),
    pytest.param(Outcome(409, KEY_REUSED, 1.0), Decision(REJECTED), id="409 reused, Retry-After"),
    pytest.param(Outcome(409), Decision(REJECTED), id="409 of the application"),
    pytest.param(Outcome(413), Decision(REJECTED), id="413"),
    pytest.param(Outcome(422), Decision(REJECTED), id="422"),
    pytest.param(Outcome(501), Decision(REJECTED), id="501"),
    pytest.param(
        Outcome(502, key_ignored="unprotected"), Decision(REJECTED), id="502, key ignored"
    ),
    pytest.param(Outcome(503, None, 1.0, "anonymous"), Decision(REJECTED), id="503, key ignored"),
    pytest.param(Outcome(201, key_ignored="unprotected"), Decision(DONE), id="201, key ignored"),
]


@pytest.mark.parametrize(("outcome", "expected"), MATRIX)
def test_retry_matrix(outcome: Outcome, expected: Decision) -> None:
    assert decide(outcome, attempt=1, elapsed=0.0, policy=POLICY, draw=0.5) == expected


def test_401_is_retried_once_when_the_credential_can_be_exchanged() -> None:
    exchange = {"policy": POLICY, "draw": 0.5, "can_reauthenticate": True}
    assert decide(Outcome(401), attempt=1, elapsed=0.0, **exchange) == Decision(
        Verdict.REAUTHENTICATE, 0.0
    )
    assert decide(Outcome(401), attempt=5, elapsed=0.0, **exchange).verdict is Verdict.EXHAUSTED


# -- backoff and caps -------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap_with_full_jitter() -> None:
    policy = RetryPolicy(base=0.5, cap=8.0)
    assert [policy.backoff(n, 1.0) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 8, 8]
    assert [policy.backoff(n, 0.0) for n in range(1, 8)] == [0.0] * 7
    assert policy.backoff(3, 0.25) == 0.5
    assert policy.backoff(10_000, 1.0) == 8.0  # no overflow however many attempts

    draws = random.Random(16)
    waits = [policy.backoff(4, draws.random()) for _ in range(1000)]
    assert all(0 <= wait < 4 for wait in waits)
    assert 1.8 < sum(waits) / len(waits) < 2.2  # spread over [0, 4), not bunched


def test_attempts_are_capped() -> None:
    policy = RetryPolicy(attempts=3)
    decisions = [
        decide(Outcome(None), attempt=n, elapsed=0.0, policy=policy, draw=0.5) for n in (1, 2, 3)
    ]
    assert [d.verdict for d in decisions] == [RETRY, RETRY, Verdict.EXHAUSTED]


def test_a_wait_past_the_time_budget_is_not_taken() -> None:
    policy = RetryPolicy(max_elapsed=10.0, base=1.0, cap=8.0)
    assert decide(Outcome(503), attempt=4, elapsed=3.0, policy=policy, draw=0.5) == Decision(
        RETRY, 4.0
    )
    late = decide(Outcome(503), attempt=4, elapsed=6.5, policy=policy, draw=0.5)
    assert late.verdict is Verdict.EXHAUSTED


def test_retry_after_is_honoured_beyond_the_backoff_cap_but_not_the_budget() -> None:
    policy = RetryPolicy(max_elapsed=30.0, cap=8.0)
    busy = Outcome(409, KEY_IN_PROGRESS, 20.0)
    assert decide(busy, attempt=1, elapsed=0.0, policy=policy, draw=0.5) == Decision(RETRY, 20.0)
    later = decide(busy, attempt=1, elapsed=15.0, policy=policy, draw=0.5)
    assert later.verdict is Verdict.EXHAUSTED  # not shortened to the 15 s left


def test_in_progress_answers_are_bounded_by_time_not_attempts() -> None:
    """They ran nothing: a busy key is waited for until the time budget, not 5 answers."""
    policy = RetryPolicy(attempts=5, max_elapsed=30.0)
    busy = Outcome(409, KEY_IN_PROGRESS, 1.0)
    assert decide(busy, attempt=12, elapsed=20.0, policy=policy, draw=0.5) == Decision(RETRY, 1.0)
    assert decide(busy, attempt=12, elapsed=29.5, policy=policy, draw=0.5).verdict is EXHAUSTED
    failed = decide(Outcome(503), attempt=12, elapsed=20.0, policy=policy, draw=0.5)
    assert failed.verdict is EXHAUSTED  # what may have run stays bounded by attempts


def test_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base=-1)


NOW = datetime(2026, 7, 30, 9, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("1", 1.0),
        ("0", 0.0),
        (" 120 ", 120.0),
        ("Thu, 30 Jul 2026 09:00:30 GMT", 30.0),
        ("Thu, 30 Jul 2026 08:59:00 GMT", 0.0),  # already past
        ("Thu, 30 Jul 2026 09:00:05 -0000", 5.0),
        (None, None),
        ("", None),
        ("-1", None),
        ("1.5", None),
        ("soon", None),
        ("²", None),
    ],
)
def test_parse_retry_after(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header, NOW) == seconds
