"""Records written by 0.1 keep replaying after the upgrade's migrations."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from idempotency_django.stores import Outcome, RecordKey, RequestInfo, get_store
from idempotency_django.stores.digests import record_digest

pytestmark = pytest.mark.django_db(transaction=True)

APP = "idempotency_django"
BEFORE = [(APP, "0001_initial")]


def migrate(targets: list[tuple[str, str]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


def latest() -> list[tuple[str, str]]:
    executor = MigrationExecutor(connection)
    return [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP]


def test_a_record_stored_by_0_1_replays_after_migrating() -> None:
    executor = migrate(BEFORE)
    old_records = executor.loader.project_state(BEFORE).apps.get_model(APP, "IdempotencyRecord")
    now = timezone.now()
    for number in range(3):  # more than one, so that the batches walk on
        old_records.objects.create(
            principal="auth.user:7",
            location="portland",
            key=f"booking-{number}",
            fingerprint="f" * 64,
            method="POST",
            path="/bookings/",
            state="completed",
            token="t" * 32,
            status_code=201,
            response_headers=[["Content-Type", "application/json"]],
            response_body=b'{"id": %d}' % number,
            created_at=now,
            completed_at=now,
            expires_at=now + timedelta(hours=1),
        )
    migrate(latest())

    from idempotency_django.models import IdempotencyRecord

    record = IdempotencyRecord.objects.get(key="booking-1")
    assert record.digest == record_digest("auth.user:7", "portland", "booking-1")
    assert record.body_omitted is False
    claim = get_store().claim(
        RecordKey("auth.user:7", "portland", "booking-1"),
        RequestInfo("POST", "/bookings/", "f" * 64),
        300,
    )
    assert claim.outcome is Outcome.REPLAY
    assert claim.response is not None and claim.response.body == b'{"id": 1}'
