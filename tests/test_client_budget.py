"""The retry client's budget against LOCK_TIMEOUT (docs/clients.md, "A crashed request")."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

from idempotency_client import KEY_IN_PROGRESS, Outcome, RetryPolicy, Verdict, decide
from idempotency_django.conf import DEFAULTS
from tests.docs_blocks import run_page_code

#: docs/clients.md's takeover budget, from the page.
client_takeover = SimpleNamespace(**run_page_code("docs/clients.md", {}, 3))

REPO_ROOT = Path(__file__).resolve().parent.parent


def play_against_a_crashed_request(policy: RetryPolicy, lock_timeout: float) -> Verdict:
    """Attempts against a key a dead request holds: 409 in progress with Retry-After
    until lock_timeout has passed since the crash (the first attempt's time), then the
    retry takes the reservation over and gets its 201."""
    rng = random.Random(25)
    elapsed, attempt = 0.0, 1
    while True:
        if elapsed >= lock_timeout:
            outcome = Outcome(201)
        else:
            outcome = Outcome(409, KEY_IN_PROGRESS, float(DEFAULTS["RETRY_AFTER"]))
        decision = decide(
            outcome, attempt=attempt, elapsed=elapsed, policy=policy, draw=rng.random()
        )
        if decision.verdict is not Verdict.RETRY:
            return decision.verdict
        elapsed += decision.delay + 0.05  # the attempt itself takes a little time
        attempt += 1


def test_the_default_budget_gives_up_before_a_crashed_request_is_taken_over() -> None:
    """What the page says: the defaults suit an interactive caller, not a takeover."""
    assert DEFAULTS["LOCK_TIMEOUT"] > RetryPolicy().max_elapsed
    verdict = play_against_a_crashed_request(RetryPolicy(), DEFAULTS["LOCK_TIMEOUT"])
    assert verdict is Verdict.EXHAUSTED


def test_with_the_heartbeat_the_default_budget_outlasts_a_crashed_request() -> None:
    """HEARTBEAT lets LOCK_TIMEOUT be seconds: the default 30 s then sees the takeover.

    The answers in progress count against the time budget only, so the default
    client keeps asking (each Retry-After, 1 s) until the key is free.
    """
    lock_timeout = 10  # e.g. {"HEARTBEAT": 2, "LOCK_TIMEOUT": 10} (docs/settings.md)
    assert play_against_a_crashed_request(RetryPolicy(), lock_timeout) is Verdict.DONE
    assert play_against_a_crashed_request(RetryPolicy(), 31) is Verdict.EXHAUSTED


def test_the_documented_takeover_policy_outlasts_lock_timeout() -> None:
    assert DEFAULTS["LOCK_TIMEOUT"] == client_takeover.LOCK_TIMEOUT
    assert DEFAULTS["RETRY_AFTER"] == client_takeover.RETRY_AFTER
    policy = client_takeover.takeover_policy
    assert play_against_a_crashed_request(policy, DEFAULTS["LOCK_TIMEOUT"]) is Verdict.DONE


def test_the_clients_page_joins_the_budget_to_lock_timeout() -> None:
    text = (REPO_ROOT / "docs" / "clients.md").read_text()
    section = text.split("### A crashed request and LOCK_TIMEOUT", 1)[1].split("\n## ", 1)[0]
    assert "takeover_policy = RetryPolicy(" in section
    policy = RetryPolicy()
    assert f"attempts={policy.attempts}, max_elapsed={policy.max_elapsed}" in text
    assert "settings.md#lock_timeout" in section
