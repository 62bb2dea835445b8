from __future__ import annotations

import io
import json
import re
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, close_old_connections, connection, connections
from django.test import override_settings
from django.utils import timezone

from idempotency_django import purge as purge_module
from idempotency_django.management.commands.purge_idempotency_records import (
    Command as PurgeCommand,
)
from idempotency_django.models import IdempotencyRecord
from idempotency_django.purge import (
    KINDS,
    database_now,
    parse_duration,
    purge,
    purge_principal,
)
from idempotency_django.tasks import idempotent_task
from tests.factories import IdempotencyRecordFactory
from tests.redis_helpers import REDIS_URL
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

COMMAND = "purge_idempotency_records"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(COMMAND, *args, stdout=out)
    return out.getvalue()


def remaining() -> set[str]:
    return set(IdempotencyRecord.objects.values_list("key", flat=True))


@pytest.fixture
def mixed() -> dict[str, IdempotencyRecord]:
    return {
        "live": IdempotencyRecordFactory.create(key="live"),
        "expired": IdempotencyRecordFactory.create(key="expired", expired=True),
        "reserved": IdempotencyRecordFactory.create(key="reserved", in_progress=True),
        "abandoned": IdempotencyRecordFactory.create(
            key="abandoned", in_progress=True, expired=True
        ),
    }


def test_factory_defaults_and_traits() -> None:
    live = IdempotencyRecordFactory.create()
    reserved = IdempotencyRecordFactory.create(in_progress=True)
    abandoned = IdempotencyRecordFactory.create(in_progress=True, expired=True)
    assert live.state == IdempotencyRecord.State.COMPLETED and not live.is_expired
    assert reserved.state == IdempotencyRecord.State.IN_PROGRESS and not reserved.is_expired
    assert reserved.status_code is None and reserved.completed_at is None
    assert abandoned.state == IdempotencyRecord.State.IN_PROGRESS and abandoned.is_expired


def test_deletes_expired_and_abandoned_only(mixed: dict[str, IdempotencyRecord]) -> None:
    output = run()
    assert remaining() == {"live", "reserved"}
    assert "Deleted 1 completed record (database 'default')." in output
    assert "Deleted 1 abandoned reservation (database 'default')." in output


def test_purge_function_returns_counts_per_kind(mixed: dict[str, IdempotencyRecord]) -> None:
    IdempotencyRecordFactory.create_batch(3, expired=True)
    assert purge() == {"completed": 4, "abandoned": 1, "deliveries": 0}
    assert purge() == {"completed": 0, "abandoned": 0, "deliveries": 0}
    assert [kind.label for kind in KINDS] == ["completed", "deliveries", "abandoned"]


def purge_nightly() -> dict[str, int]:
    """Report what would go, then purge, also dropping records completed over a week ago."""
    from datetime import timedelta

    from idempotency_django.purge import purge

    would = purge(dry_run=True)  # e.g. {"completed": 2, "deliveries": 0, ...}; deletes nothing
    print(f"purging {would}")
    return purge(older_than=timedelta(days=7), batch_size=1000, using="default")


def test_purge_from_code_example(capsys: pytest.CaptureFixture[str]) -> None:
    """The example on docs/operating.md."""
    IdempotencyRecordFactory.create_batch(2, expired=True)
    now = timezone.now()
    IdempotencyRecordFactory.create(
        created_at=now - timedelta(days=8), expires_at=now + timedelta(1)
    )
    IdempotencyRecordFactory.create(key="kept")
    assert purge_nightly() == {"completed": 3, "abandoned": 0, "deliveries": 0}
    assert "purging {'completed': 2, 'deliveries': 0, 'abandoned': 0}" in capsys.readouterr().out
    assert remaining() == {"kept"}


def test_record_expiring_exactly_now_is_expired() -> None:
    now = timezone.now()
    IdempotencyRecordFactory.create(key="edge", expires_at=now)
    IdempotencyRecordFactory.create(key="later", expires_at=now + timedelta(microseconds=1))
    assert purge(now=now) == {"completed": 1, "abandoned": 0, "deliveries": 0}
    assert remaining() == {"later"}


def test_batch_size_is_honoured() -> None:
    IdempotencyRecordFactory.create_batch(25, expired=True)
    IdempotencyRecordFactory.create_batch(3)
    batches: list[int] = []
    counts = purge(batch_size=10, on_batch=lambda kind, deleted: batches.append(deleted))
    assert counts == {"completed": 25, "abandoned": 0, "deliveries": 0}
    assert batches == [10, 10, 5]
    assert IdempotencyRecord.objects.count() == 3


def test_batch_size_option() -> None:
    IdempotencyRecordFactory.create_batch(25, expired=True)
    output = run("--batch-size", "10", "-v", "2")
    assert output.count("completed records: deleted a batch of 10") == 2
    assert "completed records: deleted a batch of 5" in output
    assert "Deleted 25 completed records" in output
    assert not IdempotencyRecord.objects.exists()


def test_batches_larger_than_sqlite_parameter_limit() -> None:
    IdempotencyRecordFactory.create_batch(1200, expired=True)
    assert purge(batch_size=1100) == {"completed": 1200, "abandoned": 0, "deliveries": 0}
    assert not IdempotencyRecord.objects.exists()


def test_pause_between_full_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("idempotency_django.purge.time.sleep", sleeps.append)
    IdempotencyRecordFactory.create_batch(25, expired=True)
    assert "Deleted 25 completed records" in run("--batch-size", "10", "--pause", "0.25")
    assert sleeps == [0.25, 0.25]
    with pytest.raises(ValueError, match="pause"):
        purge(pause=-1)


@pytest.mark.parametrize("value", ["-1", "soon", "4000"])
def test_invalid_pause(value: str) -> None:
    with pytest.raises(CommandError, match="pause"):
        run("--pause", value)


@pytest.mark.parametrize("value", ["0", "-3", "ten", "", "1000001", "100000000000000000000"])
def test_invalid_batch_size(value: str) -> None:
    with pytest.raises(CommandError, match="batch-size"):
        run("--batch-size", value)


def test_dry_run_deletes_nothing(mixed: dict[str, IdempotencyRecord]) -> None:
    IdempotencyRecordFactory.create_batch(2, expired=True)
    output = run("--dry-run")
    assert IdempotencyRecord.objects.count() == 6
    assert "Would delete 3 completed records" in output
    assert "Would delete 1 abandoned reservation" in output
    assert "Dry run: nothing was deleted." in output
    assert purge(dry_run=True) == {"completed": 3, "abandoned": 1, "deliveries": 0}
    assert IdempotencyRecord.objects.count() == 6


def test_older_than_overrides_retention_but_spares_live_reservations() -> None:
    now = timezone.now()
    IdempotencyRecordFactory.create(key="old", created_at=now - timedelta(hours=3))
    IdempotencyRecordFactory.create(key="recent", created_at=now - timedelta(hours=1))
    IdempotencyRecordFactory.create(
        key="old-no-completed-at", created_at=now - timedelta(hours=5), completed_at=None
    )
    IdempotencyRecordFactory.create(
        key="old-created-recently-completed",
        created_at=now - timedelta(hours=5),
        completed_at=now - timedelta(minutes=5),
    )
    # A reservation that is old but was given a long takeover window: still live.
    IdempotencyRecordFactory.create(
        key="old-reservation",
        in_progress=True,
        created_at=now - timedelta(hours=3),
        expires_at=now + timedelta(minutes=5),
    )
    IdempotencyRecordFactory.create(key="abandoned", in_progress=True, expired=True)
    output = run("--older-than", "2h")
    assert remaining() == {"recent", "old-created-recently-completed", "old-reservation"}
    assert "Deleted 2 completed records" in output
    assert "Deleted 1 abandoned reservation" in output


def test_older_than_dry_run() -> None:
    now = timezone.now()
    IdempotencyRecordFactory.create(
        created_at=now - timedelta(days=8), expires_at=now + timedelta(days=1)
    )
    assert "Would delete 1 completed record" in run("--older-than", "7d", "--dry-run")
    assert "Would delete 0 completed records" in run("--dry-run")
    assert IdempotencyRecord.objects.count() == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("30m", timedelta(minutes=30)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
        (" 7D ", timedelta(days=7)),
    ],
)
def test_parse_duration(value: str, expected: timedelta) -> None:
    assert parse_duration(value) == expected


@pytest.mark.parametrize(
    "value", ["", "7", "7y", "-1d", "0s", "1.5h", "d", "h2", "99999999999d", "1000000w", "36526d"]
)
def test_invalid_older_than(value: str) -> None:
    with pytest.raises(ValueError, match="Invalid duration"):
        parse_duration(value)
    with pytest.raises(CommandError, match="older-than"):
        run("--older-than", value)


def test_the_longest_older_than_is_a_century() -> None:
    assert parse_duration("36525d") == timedelta(days=36525)
    assert "Deleted 0 completed records" in run("--older-than", "5200w")
    # From code, a duration reaching back before the year 1 is a ValueError, not an overflow.
    with pytest.raises(ValueError, match="before the year 1"):
        purge(older_than=timedelta(days=10**6))


def test_unknown_database() -> None:
    with pytest.raises(CommandError, match="Unknown database 'nope'"):
        run("--database", "nope")


@override_settings(IDEMPOTENCY={"STORE_OPTIONS": {"database": "missing"}})
def test_database_defaults_to_the_store_alias() -> None:
    with pytest.raises(CommandError, match="Unknown database 'missing'"):
        run()
    assert "(database 'default')" in run("--database", "default")


def test_database_error_becomes_command_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**kwargs: Any) -> dict[str, int]:
        raise OperationalError("database is on fire")

    monkeypatch.setattr(
        "idempotency_django.management.commands.purge_idempotency_records.purge", broken
    )
    with pytest.raises(CommandError, match="database is on fire"):
        run()


def test_row_taken_over_between_select_and_delete_survives() -> None:
    expired = IdempotencyRecordFactory.create_batch(3, expired=True)
    now = timezone.now()
    kind = KINDS[0]
    rows = IdempotencyRecord.objects.filter(kind.filter(now, None))
    pks = list(rows.values_list("pk", flat=True))
    # A new claim takes one over: it is a live reservation again.
    IdempotencyRecord.objects.filter(pk=expired[0].pk).update(
        state=IdempotencyRecord.State.IN_PROGRESS, expires_at=now + timedelta(minutes=5)
    )
    assert purge_module._delete(rows, pks, "default") == 2
    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [expired[0].pk]


@override_settings(
    IDEMPOTENCY={"STORE": "redis", "STORE_OPTIONS": {"cache": "redis"}},
    CACHES={
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": REDIS_URL,
        },
    },
)
def test_redis_store_has_nothing_to_purge() -> None:
    pytest.importorskip("idempotency_django.stores.redis")
    IdempotencyRecordFactory.create(expired=True)
    output = run()
    assert output.strip() == "The redis store expires entries by itself; nothing to purge."
    assert IdempotencyRecord.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_purges_neither_crash_nor_double_count() -> None:
    IdempotencyRecordFactory.create_batch(300, expired=True)
    IdempotencyRecordFactory.create_batch(40, in_progress=True, expired=True)
    IdempotencyRecordFactory.create_batch(20)
    IdempotencyRecordFactory.create_batch(10, in_progress=True)
    results: list[dict[str, int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def worker() -> None:
        try:
            start.wait()
            results.append(purge(batch_size=25))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            close_old_connections()
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert len(results) == 2
    assert sum(r["completed"] for r in results) == 300
    assert sum(r["abandoned"] for r in results) == 40
    assert IdempotencyRecord.objects.count() == 30


def test_webhook_deliveries_are_purged_and_counted_apart() -> None:
    IdempotencyRecordFactory.create(key="old-delivery", kind="webhook", expired=True)
    IdempotencyRecordFactory.create(key="live-delivery", kind="webhook")
    IdempotencyRecordFactory.create(key="old-request", expired=True)
    assert purge() == {"completed": 1, "abandoned": 0, "deliveries": 1}
    assert remaining() == {"live-delivery"}


def test_older_than_leaves_webhook_deliveries_their_own_retention(client: Any) -> None:
    """Shrinking the responses' retention must not shorten the 7-day window in which a
    provider's redelivery is a duplicate: it ran the webhook's work a second time."""
    url, headers = "/hooks/trg-older-than/", {"HTTP_WEBHOOK_ID": "msg_2Lz8"}
    body = json.dumps({"event": "order.paid", "order": 4471})
    assert client.post(url, body, content_type="application/json", **headers).status_code == 202
    IdempotencyRecordFactory.create(
        key="old-request", completed_at=timezone.now() - timedelta(hours=3)
    )
    assert purge(
        now=database_now("default") + timedelta(hours=2), older_than=timedelta(hours=1)
    ) == {
        "completed": 1,
        "deliveries": 0,
        "abandoned": 0,
    }
    again = client.post(url, body, content_type="application/json", **headers)
    assert again.status_code == 202 and again.json() == {"status": "duplicate"}
    assert Booking.objects.filter(slot="webhook-run").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_task_result_past_its_retention_is_purged() -> None:
    """A background task's stored result (kind "task") goes like a request's response."""

    @idempotent_task(name="purged-task", retention=60)
    def book(room: int) -> dict[str, int]:
        return {"room": room}

    assert book(7, idempotency_key="booking-7") == {"room": 7}
    assert purge() == {"completed": 0, "abandoned": 0, "deliveries": 0}
    assert remaining() == {"booking-7"}
    # Two minutes on (the database's clock, as the store sees it): past its retention.
    later = database_now("default") + timedelta(minutes=2)
    assert purge(now=later, dry_run=True)["completed"] == 1
    assert purge(now=later) == {"completed": 1, "abandoned": 0, "deliveries": 0}
    assert remaining() == set()


@pytest.mark.django_db(transaction=True)
def test_older_than_leaves_task_results_their_own_retention() -> None:
    """Shrinking the responses' retention must not shorten the window in which a task's
    redelivery (a broker delivers at least once) gets its stored result: the purged
    result let the redelivery run the task's work a second time."""
    runs: list[int] = []

    @idempotent_task(name="older-than-task", retention=7 * 24 * 3600)
    def book(room: int) -> dict[str, int]:
        runs.append(room)
        return {"room": room}

    assert book(7, idempotency_key="booking-7") == {"room": 7}
    IdempotencyRecordFactory.create(
        key="old-request", completed_at=timezone.now() - timedelta(hours=3)
    )
    # Two hours on (the database's clock), 'purge --older-than 1h'.
    later = database_now("default") + timedelta(hours=2)
    assert purge(now=later, older_than=timedelta(hours=1)) == {
        "completed": 1,
        "deliveries": 0,
        "abandoned": 0,
    }
    assert remaining() == {"booking-7"}
    assert book(7, idempotency_key="booking-7") == {"room": 7}  # the redelivery
    assert runs == [7]


def test_older_than_option_keeps_a_task_record_inside_its_retention() -> None:
    now = timezone.now()
    three_hours_ago = now - timedelta(hours=3)
    IdempotencyRecordFactory.create(
        key="task", kind="task", completed_at=three_hours_ago, expires_at=now + timedelta(days=4)
    )
    IdempotencyRecordFactory.create(key="request", completed_at=three_hours_ago)
    assert "Deleted 1 completed record " in run("--older-than", "1h")
    assert remaining() == {"task"}


# -- one principal's records --------------------------------------------------------


@pytest.fixture
def principals() -> dict[str, IdempotencyRecord]:
    """auth.user:42's records of every sort, and others' that must stay."""
    return {
        "live": IdempotencyRecordFactory.create(key="live", principal="auth.user:42"),
        "expired": IdempotencyRecordFactory.create(
            key="expired", principal="auth.user:42", expired=True
        ),
        "reserved": IdempotencyRecordFactory.create(
            key="reserved", principal="auth.user:42", in_progress=True
        ),
        "elsewhere": IdempotencyRecordFactory.create(
            key="elsewhere", principal="auth.user:42", location="shop-7"
        ),
        "delivery": IdempotencyRecordFactory.create(
            key="delivery", principal="auth.user:42", kind="webhook"
        ),
        "other": IdempotencyRecordFactory.create(key="other", principal="auth.user:7"),
        "prefix": IdempotencyRecordFactory.create(key="prefix", principal="auth.user:420"),
        "case": IdempotencyRecordFactory.create(key="case", principal="AUTH.USER:42"),
    }


def test_purge_principal_deletes_all_of_theirs_and_nothing_else(
    principals: dict[str, IdempotencyRecord],
) -> None:
    assert purge_principal("auth.user:42", dry_run=True) == 5
    assert IdempotencyRecord.objects.count() == 8
    assert purge_principal("auth.user:42") == 5
    assert remaining() == {"other", "prefix", "case"}
    assert purge_principal("auth.user:42") == 0


def test_a_request_running_through_a_principal_purge_still_stores_its_answer() -> None:
    """Why the docs say to stop a principal's requests (deactivate the account) first."""
    from idempotency_django.stores import RecordKey, RequestInfo, StoredResponse, get_store

    store = get_store()
    key = RecordKey("auth.user:42", "", "running")
    claim = store.claim(key, RequestInfo("POST", "/plain/bookings/", "f" * 64), 300)
    assert purge_principal("auth.user:42") == 1
    assert not IdempotencyRecord.objects.exists()
    answer = StoredResponse(201, (("Content-Type", "application/json"),), b"{}")
    info = RequestInfo("POST", "/plain/bookings/", "f" * 64)
    assert store.complete(key, claim.token, answer, 3600, request=info)
    assert remaining() == {"running"}


def test_purge_principal_in_batches_logging_each_record() -> None:
    IdempotencyRecordFactory.create_batch(23, principal="auth.user:42")
    IdempotencyRecordFactory.create_batch(4, principal="auth.user:7")
    seen: list[list[str]] = []

    def on_batch(records: Any) -> None:
        # Called before the delete, in its transaction: the rows are still there.
        assert IdempotencyRecord.objects.filter(pk__in=[r.pk for r in records]).count() == len(
            records
        )
        seen.append([str(record) for record in records])

    assert purge_principal("auth.user:42", batch_size=10, on_batch=on_batch) == 23
    assert [len(batch) for batch in seen] == [10, 10, 3]
    assert all("(auth.user:42, -)" in text for batch in seen for text in batch)
    assert IdempotencyRecord.objects.count() == 4


def test_purge_principal_finds_a_principal_stored_as_its_digest() -> None:
    """The store keeps a principal too long for its column as sha256:<hex> of it."""
    from idempotency_django.stores.digests import readable_value

    long_principal = "tenant-with-a-very-long-name:" + "x" * 300
    IdempotencyRecordFactory.create(key="long", principal=readable_value(long_principal))
    IdempotencyRecordFactory.create(key="kept")
    assert purge_principal(long_principal) == 1
    assert remaining() == {"kept"}


def test_purge_principal_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        purge_principal("auth.user:1", batch_size=0)
    with pytest.raises(ValueError, match="pause"):
        purge_principal("auth.user:1", pause=-1)


def test_principal_option(principals: dict[str, IdempotencyRecord]) -> None:
    output = run("--principal", "auth.user:42", "--batch-size", "2", "-v", "2")
    assert "Deleted 5 records of principal 'auth.user:42' (database 'default')." in output
    assert output.count("deleting a batch of 2") == 2
    assert "deleting a batch of 1" in output
    assert remaining() == {"other", "prefix", "case"}
    # Expired rows of others are left for the ordinary purge.
    assert "completed records" not in output


def test_principal_option_dry_run(principals: dict[str, IdempotencyRecord]) -> None:
    output = run("--principal", "auth.user:42", "--dry-run")
    assert "Would delete 5 records of principal 'auth.user:42'" in output
    assert "Dry run: nothing was deleted." in output
    assert IdempotencyRecord.objects.count() == 8


def test_user_option_resolves_the_username(alice: Any) -> None:
    IdempotencyRecordFactory.create(key="hers", principal=f"auth.user:{alice.pk}")
    IdempotencyRecordFactory.create(key="kept", principal="auth.user:987654")
    output = run("--user", "alice")
    assert f"Deleted 1 record of principal 'auth.user:{alice.pk}'" in output
    assert remaining() == {"kept"}


def test_user_option_for_an_unknown_user() -> None:
    with pytest.raises(CommandError, match=r"No user 'ghost'.*--principal auth\.user:<its id>"):
        run("--user", "ghost")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--principal", "auth.user:1", "--older-than", "2h"], "--older-than does not apply"),
        (["--principal", "auth.user:1", "--user", "alice"], "not allowed with argument"),
        (["--principal", "  "], "--principal must not be empty"),
    ],
)
def test_principal_option_conflicts(args: list[str], message: str) -> None:
    IdempotencyRecordFactory.create(principal="auth.user:1")
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert IdempotencyRecord.objects.count() == 1


@pytest.mark.parametrize("option", ["--principal", "--user"])
def test_a_nul_in_the_principal_or_username_is_a_clear_error(option: str) -> None:
    # PostgreSQL's DataError on the user lookup was a traceback.
    with pytest.raises(CommandError, match=f"{option} must not contain a NUL character"):
        run(option, "alice\x00")


@override_settings(
    IDEMPOTENCY={"STORE": "redis", "STORE_OPTIONS": {"cache": "redis"}},
    CACHES={
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL},
    },
)
def test_principal_option_on_the_redis_store_says_it_cannot() -> None:
    pytest.importorskip("idempotency_django.stores.redis")
    with pytest.raises(CommandError, match="cannot find one principal's entries"):
        run("--principal", "auth.user:42")


def forget_deleted_user(sender: type[Any], instance: Any, **kwargs: Any) -> None:
    """On account deletion, delete the user's idempotency records too.

    Connect it once, e.g. in an AppConfig.ready():
    post_delete.connect(forget_deleted_user, sender=settings.AUTH_USER_MODEL)
    """
    from idempotency_django.protocol.scope import principal_of
    from idempotency_django.purge import purge_principal

    principal = principal_of(instance)  # "auth.user:42": as the default scope names users
    if principal is not None:
        purge_principal(principal)


def test_forget_deleted_user_example(alice: Any, bob: Any) -> None:
    """The example on docs/security.md."""
    from django.conf import settings
    from django.db.models.signals import post_delete

    IdempotencyRecordFactory.create(key="hers", principal=f"auth.user:{alice.pk}")
    IdempotencyRecordFactory.create(key="his", principal=f"auth.user:{bob.pk}")
    post_delete.connect(forget_deleted_user, sender=settings.AUTH_USER_MODEL)
    try:
        alice.delete()
    finally:
        post_delete.disconnect(forget_deleted_user, sender=settings.AUTH_USER_MODEL)
    assert remaining() == {"his"}


@pytest.mark.skipif(connection.vendor != "mysql", reason="MySQL/MariaDB collations")
@pytest.mark.django_db(transaction=True)
def test_purge_principal_is_exact_under_a_case_insensitive_collation() -> None:
    """A project's MariaDB table may compare "AUTH.USER:42" equal to "auth.user:42"."""
    table = connection.ops.quote_name(IdempotencyRecord._meta.db_table)
    alter = f"ALTER TABLE {table} MODIFY principal varchar(255) NOT NULL COLLATE %s"
    IdempotencyRecordFactory.create(key="theirs", principal="auth.user:42")
    IdempotencyRecordFactory.create(key="someone-else", principal="AUTH.USER:42 ")
    with connection.cursor() as cursor:
        cursor.execute(alter % "utf8mb4_general_ci")
    try:
        assert IdempotencyRecord.objects.filter(principal="auth.user:42").count() == 2
        assert purge_principal("auth.user:42", dry_run=True) == 1
        assert purge_principal("auth.user:42") == 1
        assert remaining() == {"someone-else"}
    finally:
        with connection.cursor() as cursor:
            cursor.execute(alter % "utf8mb4_bin")


# -- what the command prints while it works ---------------------------------------


def run_with_progress(interval: float, *args: str) -> str:
    command = PurgeCommand()
    command.progress_interval = interval
    out = io.StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def test_a_long_purge_prints_its_running_total() -> None:
    """At the default verbosity, a line per progress_interval: here every batch."""
    IdempotencyRecordFactory.create_batch(25, expired=True)
    output = run_with_progress(0, "--batch-size", "10")
    totals = re.findall(
        r"^  completed records: ([\d,]+) completed records? so far, about ([\d,]+) left \(",
        output,
        re.M,
    )
    assert totals == [("10", "15"), ("20", "5"), ("25", "0")], output
    assert re.search(r"left \([\d,]+ rows/s\)$", output, re.M)
    assert "Deleted 25 completed records (database 'default')." in output


def test_a_short_purge_prints_only_its_totals() -> None:
    IdempotencyRecordFactory.create_batch(25, expired=True)
    output = run("--batch-size", "10")
    assert "so far" not in output
    assert output.count("\n") == 3, output


def test_every_batch_at_verbosity_2_with_the_running_total() -> None:
    IdempotencyRecordFactory.create_batch(25, expired=True)
    output = run("--batch-size", "10", "-v", "2")
    assert (
        "completed records: deleted a batch of 10, 20 completed records so far, about 5 left"
        in (output)
    )


def test_counts_of_one_are_singular() -> None:
    IdempotencyRecordFactory.create(expired=True)
    output = run("-v", "0")
    assert "Deleted 1 completed record (database 'default')." in output
    assert "Deleted 0 webhook deliveries (database 'default')." in output


def test_help_and_docs_say_the_same_of_the_batch_size() -> None:
    parser = PurgeCommand().create_parser("manage.py", COMMAND)
    help_text = " ".join(parser.format_help().split())
    operating = (Path(__file__).resolve().parent.parent / "docs" / "operating.md").read_text()
    row = re.search(r"^\| `--batch-size N` \| `(\d+)` \| (.+?) \|$", operating, re.M)
    assert row, "docs/operating.md documents --batch-size"
    assert f"{row[2].rstrip('.')} (default {row[1]})" in help_text
    assert "per batch" in help_text and "per statement" not in help_text
