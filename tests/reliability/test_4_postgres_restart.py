"""Scenario 4: PostgreSQL stopped and started while clients send keyed writes.

The cluster is the test's own (initdb + pg_ctl on a free port), never the
machine's shared server. Both stores keep their bookings in it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.reliability import harness
from tests.reliability.harness import STORE_LABELS

LOCK_TIMEOUT_S = 3


@pytest.fixture(scope="module")
def cluster() -> Iterator[harness.PgCluster]:
    cluster = harness.PgCluster()
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.mark.parametrize("store", ["db-postgres", "redis"])
def test_postgres_restart_refuses_then_books_once(store: str, cluster: harness.PgCluster) -> None:
    db = harness.PgDatabase(port=cluster.port)
    db.create()
    with harness.stack(
        f"pg-restart-{store}", store, db=db, lock_timeout=LOCK_TIMEOUT_S, delay_ms=50
    ) as stack:
        replies, outage = harness.traffic_with_outage(
            stack,
            stack.users["alice"],
            stop=cluster.stop,
            start=cluster.start,
            prefix=f"pg-{uuid.uuid4().hex[:6]}",
        )
        verdict = harness.verify(db, replies)
        output = stack.server.output()
    # Where the 500s come from: DRF authenticates (a django_session query) before the
    # handler that claims the key runs, so the store never gets to answer 503.
    in_auth = output.count("in perform_authentication")
    errors = output.count("Internal Server Error: ")
    everything = [reply for answers in replies.values() for reply in answers]
    down = [reply for reply in everything if outage.during(reply)]
    during = harness.statuses(down)
    harness.record_verdict(
        "4 PostgreSQL restarted",
        STORE_LABELS[store],
        everything,
        verdict,
        note="while down: "
        + ", ".join(f"{n} x {label}" for label, n in during.items())
        + f"; {in_auth} of {errors} 500s raised in DRF authentication (OperationalError)",
    )
    assert down, "no request was answered while PostgreSQL was down"
    # Nothing is accepted while the database is down; each refusal is a 5xx.
    assert all(reply.status in (500, 503) for reply in down), during
    assert not verdict.problems, verdict.problems[:20]
    assert verdict.found == verdict.keys
    assert all("OperationalError" in part for part in output.split("Internal Server Error: ")[1:])


def test_postgres_crash_under_atomic_requests_books_each_key_once(
    cluster: harness.PgCluster,
) -> None:
    """A crash (immediate stop, then recovery from the WAL) with ATOMIC_REQUESTS.

    The reservation, the booking and its stored response are one transaction:
    a crash may lose it whole, never a stored response whose booking survived.
    Every key books once, and every booking has its completed record.
    """
    db = harness.PgDatabase(port=cluster.port)
    db.create()
    with harness.stack(
        "pg-crash", "db-postgres", db=db, lock_timeout=LOCK_TIMEOUT_S, delay_ms=50, atomic=True
    ) as stack:
        replies, outage = harness.traffic_with_outage(
            stack,
            stack.users["alice"],
            stop=cluster.crash,
            start=cluster.start,
            prefix=f"crash-{uuid.uuid4().hex[:6]}",
        )
        verdict = harness.verify(db, replies)
    unanswered = db.query(
        "SELECT b.customer FROM bookings_booking b WHERE NOT EXISTS ("
        " SELECT 1 FROM idempotency_django_idempotencyrecord r"
        " WHERE r.key = b.customer AND r.state = 'completed')"
    )
    everything = [reply for answers in replies.values() for reply in answers]
    down = [reply for reply in everything if outage.during(reply)]
    harness.record_verdict(
        "4 PostgreSQL crashed (immediate stop), ATOMIC_REQUESTS",
        STORE_LABELS["db-postgres"],
        everything,
        verdict,
        note="while down: "
        + ", ".join(f"{n} x {label}" for label, n in harness.statuses(down).items())
        + f"; bookings without a completed record: {len(unanswered)}",
    )
    assert down, "no request was answered while PostgreSQL was down"
    assert not verdict.problems, verdict.problems[:20]
    assert verdict.found == verdict.keys
    assert not unanswered, unanswered[:5]


#: Requests parked in the view at once: the server's one worker has as many threads.
PARKED = 8


@pytest.fixture(scope="module")
def lazy_cluster() -> Iterator[harness.PgCluster]:
    """A cluster whose WAL writer runs every 10 s: only a synchronous commit flushes sooner."""
    cluster = harness.PgCluster(wal_writer_delay="10s")
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


def test_postgres_crash_between_claims_and_completions_books_each_key_once(
    lazy_cluster: harness.PgCluster,
) -> None:
    """A crash (immediate stop) while 8 autocommit requests sit between claim and completion.

    Without ATOMIC_REQUESTS, with ``async_claim_commit``, a claim commits on its
    own without waiting for the disk (docs/stores.md, "The claim's commit"). Every
    request is parked in the view (a 2 s booking, before its INSERT) when
    PostgreSQL crashes; with the WAL writer asleep, claims no later commit flushed
    are lost. The parked requests then fail on their dead connection, and the
    retries book: a lost claim lets its retry in at once, a kept one after
    LOCK_TIMEOUT. Each key books once.
    """
    cluster = lazy_cluster
    db = harness.PgDatabase(port=cluster.port)
    db.create()
    prefix = f"claims-{uuid.uuid4().hex[:6]}"
    keys = [f"{prefix}-{index:02d}" for index in range(PARKED)]
    replies: dict[str, list[harness.Reply]] = {key: [] for key in keys}

    def reservations() -> int:
        rows = db.query(
            f"SELECT count(*) FROM {harness.RECORD_TABLE} WHERE key LIKE %s "
            "AND state = 'in_progress'",
            (f"{prefix}-%",),
        )
        return int(rows[0][0])

    with harness.stack(
        "pg-crash-claims",
        "db-postgres",
        db=db,
        lock_timeout=LOCK_TIMEOUT_S,
        delay_ms=2000,
        workers=1,
        threads=PARKED,
        extra_env={"EXAMPLE_ASYNC_CLAIM_COMMIT": "1"},
    ) as stack:
        user = stack.users["alice"]
        first = [
            threading.Thread(
                target=lambda key=key: replies[key].append(harness.post_booking(stack, user, key)),
                daemon=True,
            )
            for key in keys
        ]
        for thread in first:
            thread.start()
        harness.wait_until(lambda: reservations() == PARKED, 10, what="every claim")
        cluster.crash()
        cluster.start()
        kept = reservations()
        for thread in first:
            thread.join(timeout=60)
        first_answers = harness.statuses(answers[0] for answers in replies.values() if answers)
        harness.settle(stack, user, replies)
        verdict = harness.verify(db, replies)
    unanswered = db.query(
        "SELECT b.customer FROM bookings_booking b WHERE NOT EXISTS ("
        " SELECT 1 FROM idempotency_django_idempotencyrecord r"
        " WHERE r.key = b.customer AND r.state = 'completed')"
    )
    everything = [reply for answers in replies.values() for reply in answers]
    harness.record_verdict(
        "4 PostgreSQL crashed between claims and completions (immediate stop), "
        "autocommit, async_claim_commit",
        STORE_LABELS["db-postgres"],
        everything,
        verdict,
        note=f"{PARKED} claims made, {kept} kept by the crash; first answers: "
        + ", ".join(f"{n} x {label}" for label, n in first_answers.items())
        + f"; bookings without a completed record: {len(unanswered)}",
    )
    assert not verdict.problems, verdict.problems[:20]
    assert verdict.found == verdict.keys == PARKED
    assert not unanswered, unanswered[:5]
    # The claims did not wait for the disk: the crash lost some of them.
    assert kept < PARKED
