"""Scenario 2: 5,000 requests over 32 concurrent clients, each key sent 1-3 times."""

from __future__ import annotations

import os
import random
import time
import uuid

import pytest

from tests.reliability import harness
from tests.reliability.harness import STORE_LABELS, STORES

CLIENTS = 32
SEED = int(os.environ.get("IDEMPOTENCY_RELIABILITY_SEED", "20260730"))
#: SQLite has one writer: 5,000 requests there take ~3 minutes on 2 cores, so half.
REQUESTS = {"db-postgres": 5000, "redis": 5000, "db-sqlite": 2500}
DELAY_MS = 20  # a short view, so that a key's parallel copies overlap


def plan(total: int, rng: random.Random, prefix: str) -> list[str]:
    """The keys in sending order: ~40% of repeated keys are sent back to back (in parallel)."""
    blocks: list[list[str]] = []
    sent = index = 0
    while sent < total:
        key = f"{prefix}-{index:05d}"
        index += 1
        count = min(rng.choice((1, 2, 3)), total - sent)
        sent += count
        if count > 1 and rng.random() < 0.4:
            blocks.append([key] * count)
        else:
            blocks.extend([key] for _ in range(count))
    rng.shuffle(blocks)
    return [key for block in blocks for key in block]


@pytest.mark.parametrize("store", STORES)
def test_many_keys_storm_books_each_once(store: str) -> None:
    rng = random.Random(SEED)
    order = plan(REQUESTS[store], rng, f"many-{uuid.uuid4().hex[:6]}")
    replies: dict[str, list[harness.Reply]] = {key: [] for key in order}
    # One user sends every key: a service account's volume, over MAX_KEYS_PER_PRINCIPAL's
    # default of 1,000 live keys, which such a principal raises (docs/settings.md).
    unlimited = {"EXAMPLE_MAX_KEYS_PER_PRINCIPAL": "0"}
    with harness.stack(
        f"storm-many-{store}", store, delay_ms=DELAY_MS, extra_env=unlimited
    ) as stack:
        alice = stack.users["alice"]
        started = time.perf_counter()
        answers = harness.parallel(
            [lambda key=key: harness.post_booking(stack, alice, key) for key in order],  # type: ignore[misc]
            CLIENTS,
        )
        elapsed = time.perf_counter() - started
        for key, reply in zip(order, answers, strict=True):
            replies[key].append(reply)
        retries = harness.settle(stack, alice, replies)
        verdict = harness.verify(stack.db, replies, stack)

    everything = answers + retries
    counts = harness.statuses(everything)
    harness.record_verdict(
        "2 storm, many keys",
        STORE_LABELS[store],
        everything,
        verdict,
        timed=answers,
        rps=len(answers) / elapsed,
        note=f"{len(order)} sent + {len(retries)} retries of 409/503; "
        + ", ".join(f"{n} x {label}" for label, n in counts.items()),
    )
    assert not verdict.problems, verdict.problems[:20]
    assert harness.five_xx(everything) == 0, counts
    assert verdict.found == verdict.keys
