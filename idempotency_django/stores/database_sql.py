"""The database store's SQL, per database: PostgreSQL, MariaDB/MySQL and SQLite.

Each statement is built once per database vendor from the model's table and
column names; :mod:`idempotency_django.stores.database` runs them. Every time
is the database's clock: ``now`` and ``now + %s seconds`` (whose parameters
:func:`later_params` gives) are written in each vendor's own SQL.

Why not the ORM: Django's ``Now()`` is ``CURRENT_TIMESTAMP(6)`` on MariaDB/MySQL,
the session's time zone, where these statements need UTC (tests/test_database_clock.py);
``bulk_create(ignore_conflicts=True)`` does not tell whether the row was inserted,
which is the claim's answer; ``QuerySet.delete()`` deletes by primary key after a
SELECT as soon as any ``pre_delete``/``post_delete`` receiver exists, so the owner's
token would no longer be checked in the DELETE itself; and a conditional
``update()`` costs about 0.2 ms more per statement than the same UPDATE sent as is
(measured on PostgreSQL, renew's UPDATE, 2026-12-04).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores.base import RecordKey, RequestInfo, StoredResponse, StoreUnavailable
from idempotency_django.stores.digests import readable_value

IN_PROGRESS = str(IdempotencyRecord.State.IN_PROGRESS)
COMPLETED = str(IdempotencyRecord.State.COMPLETED)


@dataclass(frozen=True)
class Statements:
    """The SQL of every claim, built once per database vendor."""

    now: str
    #: INSERT that does nothing when the key has a row.
    insert_or_nothing: str
    read: str
    #: MariaDB/MySQL inside a transaction: the read that fails at once on a
    #: row another transaction is writing.
    read_locked: str | None
    #: PostgreSQL inside a transaction: try the key's advisory lock.
    lock: str | None
    #: PostgreSQL inside a transaction: :attr:`insert_or_nothing` once :attr:`lock` is
    #: ours (its last parameter is the lock's id), so that a new key costs one round trip.
    insert_if_locked: str | None
    #: SQLite outside a transaction: read before inserting. An INSERT that does
    #: nothing still commits a write transaction there (about 1 ms to the disk);
    #: a read costs about 0.02 ms, so a replay need not write.
    read_first: bool
    take_over: str
    #: The INSERT and the takeover of a claim made outside a transaction, whose
    #: commit does not wait for the disk on PostgreSQL (``SET LOCAL
    #: synchronous_commit = off`` within the statement's own transaction); the
    #: same statements as the others elsewhere.
    insert_or_nothing_no_wait: str
    take_over_no_wait: str
    complete: str
    renew: str
    #: The heartbeat's renewal first locks the row, failing at once where
    #: another transaction holds it (None on SQLite, whose writers queue).
    lock_for_renewal: str | None
    release: str
    #: A principal's live keys, the first expiry among the others, and the time now.
    count_keys: str
    #: A live record's state, status and expiry, and the time now.
    lookup: str


_statements_by_vendor: dict[str, Statements] = {}

#: The columns that name a new row's key, in statement order.
KEY_COLUMNS = ("digest", "principal", "location", "key")
#: The record's columns a new row (or a takeover) gets from the request, then RESPONSE_COLUMNS.
REQUEST_COLUMNS = ("fingerprint", "method", "path", "request_id", "kind", "source", "token")
#: The record's columns a completion sets: a reservation's values until then.
RESPONSE_COLUMNS = ("state", "status_code", "response_headers", "response_body", "body_omitted")


def insert_values(
    connection: BaseDatabaseWrapper,
    key: RecordKey,
    request: RequestInfo,
    token: str,
    seconds: int,
    completed: StoredResponse | None = None,
) -> list[Any]:
    """The parameters of the INSERT: a reservation, or a completed record, for ``seconds``."""
    key_values = [key.digest, readable_value(key.principal), readable_value(key.location), key.key]
    return [
        *key_values,  # KEY_COLUMNS
        *request_values(request, token, completed),
        1 if completed is not None else 0,  # completed_at: the database's now, or NULL
        *later_params(connection, seconds),
    ]


def request_values(
    request: RequestInfo, token: str, completed: StoredResponse | None = None
) -> list[Any]:
    """The values of :data:`REQUEST_COLUMNS` and :data:`RESPONSE_COLUMNS`, each cut to fit."""
    return [
        request.fingerprint[:128],
        request.method,
        request.path[:2048],
        request.request_id[:255],
        request.kind,
        request.source[:64],
        token,
        *response_values(completed),
    ]


def response_values(response: StoredResponse | None) -> list[Any]:
    """The values of :data:`RESPONSE_COLUMNS`: ``response``'s, or a reservation's (None)."""
    if response is None:
        return [IN_PROGRESS, None, "[]", b"", False]
    headers = json.dumps([list(pair) for pair in response.headers])
    return [COMPLETED, response.status, headers, bytes(response.body), response.body_omitted]


def statements(connection: BaseDatabaseWrapper) -> Statements:
    try:
        return _statements_by_vendor[connection.display_name]
    except KeyError:
        pass
    quote = connection.ops.quote_name
    fields = {field.name: field for field in IdempotencyRecord._meta.concrete_fields}

    def column(name: str) -> str:
        return quote(str(fields[name].column))

    table = quote(IdempotencyRecord._meta.db_table)
    vendor = connection.vendor
    if vendor == "postgresql":
        now = "statement_timestamp()"
        later = "(statement_timestamp() + %s * INTERVAL '1 second')"
    elif vendor == "mysql":
        now = "UTC_TIMESTAMP(6)"
        later = "(UTC_TIMESTAMP(6) + INTERVAL %s SECOND)"
    elif vendor == "sqlite":
        # Django stores SQLite datetimes as ISO text in UTC: the same format.
        now = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
        later = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"
    else:
        raise StoreUnavailable(f"The database store does not support {vendor!r}.")

    def assignments(names: tuple[str, ...]) -> str:
        return ", ".join(f"{column(name)} = %s" for name in names)

    key_is = f"{column('digest')} = %s"
    owned = f"{key_is} AND {column('token')} = %s AND {column('state')} = %s"
    live_of_principal = f"{column('principal')} = %s AND {column('expires_at')} > {now}"
    row_columns = [*KEY_COLUMNS, *REQUEST_COLUMNS, *RESPONSE_COLUMNS]
    columns = [*row_columns, "created_at", "completed_at", "expires_at"]
    # insert_values() gives these parameters, in this order.
    values = ", ".join(["%s"] * len(row_columns) + [now, f"CASE WHEN %s = 1 THEN {now} END", later])
    insert_into = f"INSERT INTO {table} ({', '.join(map(column, columns))})"
    insert = f"{insert_into} VALUES ({values})"
    on_conflict = f" ON CONFLICT ({column('digest')}) DO NOTHING"
    # No failed statement on a replay: no "duplicate key" error in the
    # server's log, and no savepoint needed inside a transaction.
    if vendor == "mysql":
        # IGNORE also turns other errors into warnings; every value is cut
        # to its column's length, so only the duplicate key is left to ignore.
        insert_or_nothing = insert.replace("INSERT INTO", "INSERT IGNORE INTO", 1)
    else:
        insert_or_nothing = insert + on_conflict
    read_columns = ", ".join(
        [
            column("id"),
            column("token"),
            column("fingerprint"),
            column("state"),
            f"{column('expires_at')} <= {now}",
            column("status_code"),
            column("response_headers"),
            column("response_body"),
            column("body_omitted"),
        ]
    )
    read = f"SELECT {read_columns} FROM {table} WHERE {key_is}"
    take_over = (
        f"UPDATE {table} SET {assignments(REQUEST_COLUMNS + RESPONSE_COLUMNS)}, "
        f"{column('created_at')} = {now}, {column('completed_at')} = NULL, "
        f"{column('expires_at')} = {later} WHERE {column('id')} = %s "
        f"AND {column('token')} = %s AND {column('state')} = %s "
        f"AND {column('expires_at')} <= {now}"
    )
    insert_no_wait, take_over_no_wait = insert_or_nothing, take_over
    lock: str | None = None
    insert_if_locked: str | None = None
    if vendor == "postgresql":
        # Any later synchronous commit on the server flushes the log up to it.
        no_wait = "(SELECT set_config('synchronous_commit', 'off', true)) AS commit_without_wait"
        insert_no_wait = f"{insert_into} SELECT {values} FROM {no_wait}{on_conflict}"
        take_over_no_wait = take_over.replace(" WHERE ", f" FROM {no_wait} WHERE ", 1)
        # The key's advisory lock, alone and in the INSERT, whose WHERE runs once, before
        # any row reaches it: a key another transaction locked inserts nothing, and
        # waits for nobody's row.
        try_lock = "pg_try_advisory_xact_lock(%s)"
        lock = f"SELECT {try_lock}"
        insert_if_locked = f"{insert_into} SELECT {values} WHERE {try_lock}{on_conflict}"
    built = Statements(
        now=now,
        insert_or_nothing=insert_or_nothing,
        read=read,
        read_locked=_read_locked(connection, read),
        lock=lock,
        insert_if_locked=insert_if_locked,
        read_first=vendor == "sqlite",
        take_over=take_over,
        insert_or_nothing_no_wait=insert_no_wait,
        take_over_no_wait=take_over_no_wait,
        complete=(
            f"UPDATE {table} SET {assignments(RESPONSE_COLUMNS)}, "
            f"{column('completed_at')} = {now}, {column('expires_at')} = {later} WHERE {owned}"
        ),
        renew=f"UPDATE {table} SET {column('expires_at')} = {later} WHERE {owned}",
        lock_for_renewal=(
            f"SELECT {column('id')} FROM {table} WHERE {owned} "
            + connection.ops.for_update_sql(nowait=True)
            if connection.features.has_select_for_update_nowait
            else None
        ),
        release=f"DELETE FROM {table} WHERE {owned}",
        lookup=(
            f"SELECT {column('state')}, {column('status_code')}, {column('expires_at')}, {now} "
            f"FROM {table} WHERE {key_is} AND {column('expires_at')} > {now}"
        ),
        # Both walk the (principal, expires_at) index: the count reads no column
        # outside it, the first expiry of the others stops at the first entry
        # that is not this key's (this key is in the count).
        count_keys=(
            f"SELECT (SELECT COUNT(*) FROM {table} WHERE {live_of_principal}), "
            f"(SELECT {column('expires_at')} FROM {table} "
            f"WHERE {live_of_principal} AND {column('digest')} <> %s "
            f"ORDER BY {column('expires_at')} LIMIT 1), {now}"
        ),
    )
    _statements_by_vendor[connection.display_name] = built
    return built


def _read_locked(connection: BaseDatabaseWrapper, read: str) -> str | None:
    if connection.vendor != "mysql":
        return None
    if getattr(connection, "mysql_is_mariadb", False):
        return f"{read} LOCK IN SHARE MODE NOWAIT"
    return f"{read} FOR SHARE NOWAIT"


def later_params(connection: BaseDatabaseWrapper, seconds: int) -> list[Any]:
    """The parameters of a ``now + seconds`` expression (repeated where the SQL needs it)."""
    if connection.vendor == "sqlite":
        return [f"+{int(seconds)} seconds"]
    return [int(seconds)]
