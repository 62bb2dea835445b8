"""Scenario 1: 64 concurrent identical requests with one key."""

from __future__ import annotations

import threading
import uuid

import pytest

from tests.reliability import harness
from tests.reliability.harness import STORE_LABELS, STORES, Row

CLIENTS = 64
DELAY_MS = 300


@pytest.mark.parametrize("store", STORES)
def test_one_key_storm_books_once(store: str) -> None:
    with harness.stack(f"storm-one-{store}", store, delay_ms=DELAY_MS) as stack:
        alice = stack.users["alice"]
        key = f"one-{uuid.uuid4().hex[:12]}"
        barrier = threading.Barrier(CLIENTS)

        def call() -> harness.Reply:
            barrier.wait(timeout=30)
            return harness.post_booking(stack, alice, key)

        replies = harness.parallel([call] * CLIENTS, CLIENTS)
        after = harness.post_booking(stack, alice, key)
        bookings = stack.db.bookings_by_customer().get(key, [])

    fresh = [reply for reply in replies if reply.status == 201 and not reply.replayed]
    replayed = [reply for reply in replies if reply.replayed]
    in_progress = [
        reply
        for reply in replies
        if reply.status == 409 and reply.code == "idempotency_key_in_progress"
    ]
    other = [reply for reply in replies if reply not in fresh + replayed + in_progress]
    p50, p99 = harness.latency(replies)
    harness.record(
        Row(
            "1 storm, one key",
            STORE_LABELS[store],
            CLIENTS,
            1,
            len(bookings),
            harness.five_xx(replies),
            int(not bookings),
            max(0, len(bookings) - 1),
            p50,
            p99,
            note=", ".join(f"{n} x {label}" for label, n in harness.statuses(replies).items()),
        )
    )
    assert not other, [reply.short() for reply in other]
    assert len(fresh) == 1, harness.statuses(replies)
    original = fresh[0]
    assert all(reply.status == 201 and reply.body == original.body for reply in replayed)
    assert all(reply.headers.get("retry-after") for reply in in_progress)
    assert bookings == [original.json()["id"]]
    assert after.status == 201 and after.replayed and after.body == original.body
