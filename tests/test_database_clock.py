"""MariaDB/MySQL: the database store's expiries do not depend on the session's time zone.

Django stores datetimes in UTC and does not set the session's ``time_zone``;
Django's ``Now()`` is ``CURRENT_TIMESTAMP(6)`` there, the session's local time.
The store's SQL uses ``UTC_TIMESTAMP(6)`` (stores/database_sql.py), so a server
or session that is not in UTC shifts no expiry. Written for the day someone
swaps the hand-written SQL for ``Now()``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import Outcome, RecordKey, RequestInfo
from idempotency_django.stores.database import DatabaseStore

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB/MySQL's session time zone"),
]

REQUEST = RequestInfo(method="POST", path="/bookings/", fingerprint="f" * 64)


@pytest.fixture
def session_five_hours_east() -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+05:00'")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET time_zone = DEFAULT")


@pytest.mark.usefixtures("session_five_hours_east")
def test_expiries_hold_in_a_session_that_is_not_in_utc() -> None:
    store = DatabaseStore()
    key = RecordKey("alice", "", "clock")
    assert store.claim(key, REQUEST, 60).outcome is Outcome.CLAIMED
    # Read as Django reads it (UTC), the expiry is a minute away, not five hours more.
    expires_at = IdempotencyRecord.objects.get(digest=key.digest).expires_at
    assert 50 <= (expires_at - timezone.now()).total_seconds() <= 70
    assert store.claim(key, REQUEST, 60).outcome is Outcome.IN_PROGRESS
    # What Django's Now() would have compared with: five hours off.
    offset = IdempotencyRecord.objects.annotate(now=Now()).values_list("now", flat=True).get()
    assert abs((offset - store.now()).total_seconds() - 5 * 3600) < 60
