"""Scenario 5: the Redis store's (private, non-persistent) redis-server stops and starts."""

from __future__ import annotations

import uuid

from tests.reliability import harness
from tests.reliability.harness import STORE_LABELS, Row

LOCK_TIMEOUT_S = 3


def test_redis_restart_refuses_with_503_then_books_once() -> None:
    store = "redis"
    with harness.stack("redis-restart", store, lock_timeout=LOCK_TIMEOUT_S, delay_ms=50) as stack:
        assert stack.redis is not None
        alice = stack.users["alice"]
        replies, outage = harness.traffic_with_outage(
            stack,
            alice,
            stop=stack.redis.stop,
            start=stack.redis.start,
            prefix=f"rd-{uuid.uuid4().hex[:6]}",
        )
        verdict = harness.verify(stack.db, replies, stack)
        # Documented (docs/stores.md): without persistence a restart forgets every
        # stored response, so re-sending a key completed before the outage runs again.
        before = [
            key
            for key, answers in replies.items()
            if answers and answers[0].status == 201 and answers[0].started < outage.stopped_at
        ][:3]
        resent = [harness.post_booking(stack, alice, key) for key in before]
        rerun = sum(1 for reply in resent if reply.status == 201 and not reply.replayed)
        found_after = sum(len(stack.db.bookings_by_customer().get(key, [])) for key in before)
    everything = [reply for answers in replies.values() for reply in answers]
    down = [reply for reply in everything if outage.during(reply)]
    during = harness.statuses(down)
    harness.record_verdict(
        "5 Redis restarted",
        STORE_LABELS[store],
        everything,
        verdict,
        note="all 5xx are 503 before the view ran; while down: "
        + ", ".join(f"{n} x {label}" for label, n in during.items()),
    )
    harness.record(
        Row(
            "5 key completed before the Redis restart, re-sent after",
            STORE_LABELS[store],
            len(resent),
            len(before),
            found_after,
            harness.five_xx(resent),
            0,
            found_after - len(before),
            note=f"{rerun} of {len(before)} ran again: no persistence, documented in stores.md",
        )
    )
    assert down, "no request was answered while Redis was down"
    assert all(reply.status == 503 and reply.code == "idempotency_unavailable" for reply in down), (
        during
    )
    assert all(reply.headers.get("retry-after") for reply in down)
    assert not verdict.problems, verdict.problems[:20]
    assert verdict.found == verdict.keys
    # The only 5xx: 503 idempotency_unavailable, each time before the view ran.
    assert all(
        reply.status < 500 or (reply.status == 503 and reply.code == "idempotency_unavailable")
        for reply in everything
    ), harness.statuses(everything)
