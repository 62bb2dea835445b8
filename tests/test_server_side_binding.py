"""The database store on a connection that prepares every statement (PostgreSQL).

docs/stores.md tells a project it may turn on Django's ``server_side_binding`` with
psycopg's ``prepare_threshold``: the server then types each parameter itself, where
psycopg otherwise sends the values in the SQL text. Every statement the store sends
for a keyed request must work so: the claim (outside a transaction, and inside one,
where its INSERT takes the key's advisory lock), the read, the lock, the takeover,
the completion, the release and the purge. ``prepare_threshold=0`` prepares each at
its first execution, so each is parsed and typed by the server.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client
from django.utils import timezone

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import Outcome, RecordKey, RequestInfo
from idempotency_django.stores.database import DatabaseStore
from tests.concurrency import default_database
from tests.factories import IdempotencyRecordFactory
from tests.testapp.models import Booking

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="server_side_binding is PostgreSQL's (psycopg 3)"
    ),
    pytest.mark.django_db(transaction=True),  # the connection is closed and opened again
]

TABLE = "idempotency_django_idempotencyrecord"
BODY = json.dumps({"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"})


def prepared_statements(**changes: Any) -> AbstractContextManager[None]:
    """The default database with every statement prepared by the server, and ``changes``."""
    options = connections.settings["default"].get("OPTIONS", {})
    return default_database(
        OPTIONS={**options, "server_side_binding": True, "prepare_threshold": 0}, **changes
    )


def prepared_by_the_server() -> list[str]:
    """The statements this session prepared (psycopg prepares them under names of its own)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [str(row[0]) for row in cursor.fetchall()]


def post(client: Client, key: str, url: str = "/plain/bookings/", body: str = BODY) -> Any:
    return client.post(url, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.parametrize("atomic_requests", [False, True], ids=["autocommit", "ATOMIC_REQUESTS"])
def test_every_statement_of_a_keyed_request_runs_prepared(atomic_requests: bool) -> None:
    with prepared_statements(ATOMIC_REQUESTS=atomic_requests):
        connection.ensure_connection()
        assert connection.connection.prepare_threshold == 0
        user = User.objects.create_user("alice", password="alice-password")
        client = Client()
        client.force_login(user)

        first = post(client, "booking-1")
        assert first.status_code == 201
        replay = post(client, "booking-1")
        assert replay["Idempotency-Replayed"] == "true"
        assert replay.content == first.content
        reused = post(client, "booking-1", body=json.dumps({"slot": "2026-07-31T09:00:00Z"}))
        assert reused.json()["code"] == "idempotency_key_reused"
        # A 5xx gives its key back: the release (with its transaction, under ATOMIC_REQUESTS).
        assert post(client, "booking-2", url="/plain/bookings/?status=500").status_code == 500
        assert not IdempotencyRecord.objects.filter(key="booking-2").exists()
        # A reservation a crashed worker left, past its lock timeout: taken over.
        IdempotencyRecordFactory(
            principal=f"auth.user:{user.pk}", key="booking-3", in_progress=True, expired=True
        )
        taken_over = post(client, "booking-3")
        assert taken_over.status_code == 201
        assert "Idempotency-Replayed" not in taken_over
        record = IdempotencyRecord.objects.get(key="booking-3")
        assert record.state == IdempotencyRecord.State.COMPLETED

        prepared = [sql for sql in prepared_by_the_server() if TABLE in sql]
        if atomic_requests:
            assert any("pg_try_advisory_xact_lock" in sql for sql in prepared), prepared
        assert any(sql.startswith("INSERT") for sql in prepared), prepared
        assert any(sql.startswith("UPDATE") for sql in prepared), prepared

        IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
        call_command("purge_idempotency_records", verbosity=0)
        assert not IdempotencyRecord.objects.exists()
    # The first request, the 5xx's and the takeover's ran; the replay and the conflict did
    # not. Under ATOMIC_REQUESTS the 5xx's work rolled back with its reservation.
    assert Booking.objects.count() == (2 if atomic_requests else 3)


def test_what_the_options_add_runs_prepared_too() -> None:
    """The statements options add: the lookup and the lock a waiting duplicate asks
    (``WAIT_FOR_IN_PROGRESS``), a renewal (``HEARTBEAT``, or work in a transaction the
    store is not part of), the count of ``MAX_KEYS_PER_PRINCIPAL``, and
    ``async_claim_commit``'s claim and takeover, which commit without waiting."""
    key = RecordKey(principal="auth.user:1", location="portland", key="booking-8891")
    info = RequestInfo(method="POST", path="/bookings/", fingerprint="f" * 64)
    with prepared_statements():
        for store in (DatabaseStore(), DatabaseStore(async_claim_commit=True)):
            claim = store.claim(key, info, 300)
            assert claim.outcome is Outcome.CLAIMED
            assert store.is_held(key)
            state = store.lookup(key)
            assert state is not None and state.state == "in_progress"
            assert store.renew(key, claim.token, 300, info)
            assert store.count_keys(key, 600)[0] == 1
            IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
            taken_over = store.claim(key, info, 300)
            assert taken_over.outcome is Outcome.CLAIMED and taken_over.took_over
            store.release(key, taken_over.token)
            assert store.lookup(key) is None
        prepared = [sql for sql in prepared_by_the_server() if TABLE in sql]
    no_wait = [sql for sql in prepared if "set_config" in sql]
    assert sorted(sql.split()[0] for sql in no_wait) == ["INSERT", "UPDATE"], prepared
