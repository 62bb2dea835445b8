"""PostgreSQL, ``async_claim_commit``: a claim outside a transaction does not wait for the disk.

A trigger on the record table copies the ``synchronous_commit`` in force when the
claim's row is written into the row itself: that is the value its commit uses
(PostgreSQL decides per transaction, with the setting in force at commit). The
work's commit after it, and a claim inside a transaction, keep the server's
setting. Why a claim may skip the wait: docs/stores.md, "The claim's commit".
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import Outcome, RecordKey, RequestInfo, get_store
from idempotency_django.stores.database import DatabaseStore

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="synchronous_commit is PostgreSQL's"
)
pytestmark = pytest.mark.django_db(transaction=True)

REQUEST = RequestInfo(method="POST", path="/bookings/", fingerprint="f" * 64)
TABLE = IdempotencyRecord._meta.db_table


@pytest.fixture
def commit_mode_in_request_id() -> Iterator[None]:
    """Every INSERT or UPDATE of a record stores the current synchronous_commit in request_id."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION test_commit_mode() RETURNS trigger AS $$ BEGIN "
            "NEW.request_id := current_setting('synchronous_commit'); RETURN NEW; "
            "END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            f'CREATE TRIGGER test_commit_mode BEFORE INSERT OR UPDATE ON "{TABLE}" '
            "FOR EACH ROW EXECUTE FUNCTION test_commit_mode()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP TRIGGER IF EXISTS test_commit_mode ON "{TABLE}"')
            cursor.execute("DROP FUNCTION IF EXISTS test_commit_mode()")


def commit_mode(key: RecordKey) -> str:
    return str(IdempotencyRecord.objects.get(digest=key.digest).request_id)


def session_commit_mode() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


@postgresql_only
@pytest.mark.usefixtures("commit_mode_in_request_id")
def test_a_claim_in_autocommit_does_not_wait_and_the_next_commit_does() -> None:
    key = RecordKey("alice", "", "k1")
    with override_settings(IDEMPOTENCY={"STORE_OPTIONS": {"async_claim_commit": True}}):
        store = get_store()
    assert store.claim(key, REQUEST, 60).outcome is Outcome.CLAIMED
    assert commit_mode(key) == "off"
    # SET LOCAL ended with the claim's own transaction: the work's commit waits.
    assert session_commit_mode() == "on"


@postgresql_only
@pytest.mark.usefixtures("commit_mode_in_request_id")
def test_a_takeover_in_autocommit_does_not_wait() -> None:
    key = RecordKey("alice", "", "k2")
    assert DatabaseStore().claim(key, REQUEST, 60).outcome is Outcome.CLAIMED
    assert commit_mode(key) == "on"
    IdempotencyRecord.objects.filter(digest=key.digest).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    claim = DatabaseStore(async_claim_commit=True).claim(key, REQUEST, 60)
    assert (claim.outcome, claim.took_over) == (Outcome.CLAIMED, True)
    assert commit_mode(key) == "off"
    assert session_commit_mode() == "on"


@postgresql_only
@pytest.mark.usefixtures("commit_mode_in_request_id")
def test_a_claim_in_a_transaction_commits_with_the_work_and_waits() -> None:
    key = RecordKey("alice", "", "k3")
    with transaction.atomic():
        claim = DatabaseStore(async_claim_commit=True).claim(key, REQUEST, 60)
        assert claim.outcome is Outcome.CLAIMED
        assert session_commit_mode() == "on"
    assert commit_mode(key) == "on"


@postgresql_only
@pytest.mark.usefixtures("commit_mode_in_request_id")
def test_by_default_every_claim_waits() -> None:
    key = RecordKey("alice", "", "k4")
    claim = DatabaseStore().claim(key, REQUEST, 60)
    assert claim.outcome is Outcome.CLAIMED
    assert commit_mode(key) == "on"


def test_the_option_elsewhere_is_a_warning() -> None:
    warned = {message.id for message in DatabaseStore(async_claim_commit=True).check()}
    assert ("idempotency_django.W013" in warned) is (connection.vendor != "postgresql")
    assert "idempotency_django.W013" not in {message.id for message in DatabaseStore().check()}
