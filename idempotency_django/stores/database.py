"""The default store: one row per key in :class:`~idempotency_django.models.IdempotencyRecord`.

Everything goes through the request's own connection; there is no second one.

* **No transaction open** (autocommit): the claim's INSERT commits at once,
  so every other request sees the reservation. A request that dies leaves it
  behind until ``LOCK_TIMEOUT``, when another claim may take it over. With
  ``async_claim_commit`` on PostgreSQL that commit does not wait for the disk
  (docs/stores.md says when that is safe).
* **Inside a transaction** (``ATOMIC_REQUESTS``, ``atomic=True``, or a
  caller's own ``transaction.atomic``): the claim, the view's writes and the
  stored response commit or roll back together. The reservation is not
  committed while the view runs, so a lock the database provides tells a
  duplicate at once that the key is taken: a transaction-level advisory lock
  on PostgreSQL (``pg_try_advisory_xact_lock``), a ``LOCK IN SHARE MODE
  NOWAIT`` read on MariaDB/MySQL, and SQLite's single writer (a duplicate
  waits for the first to finish, then replays it). A claim inside a
  transaction can never be taken over: its locks last until it ends, and a
  crash rolls the reservation back with the work.

Every time is the database's clock (``statement_timestamp()``,
``UTC_TIMESTAMP(6)``, SQLite's ``'now'``), never an app server's, and a
takeover compares the owner token, the state and the expiry in one UPDATE.
The statements, per database, are :mod:`idempotency_django.stores.database_sql`'s.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any, NamedTuple

from django.conf import settings
from django.core import checks
from django.db import (
    DEFAULT_DB_ALIAS,
    Error,
    OperationalError,
    connections,
    models,
)
from django.db.backends.base.base import BaseDatabaseWrapper

from idempotency_django.encryption import seal, unseal
from idempotency_django.fingerprint import same_request
from idempotency_django.keys import readable_value
from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores.base import (
    BaseStore,
    Claim,
    KeyState,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
)
from idempotency_django.stores.database_sql import later_params, statements

State = IdempotencyRecord.State
IN_PROGRESS = str(State.IN_PROGRESS)
COMPLETED = str(State.COMPLETED)

#: MariaDB/MySQL errors a NOWAIT read raises when another transaction holds the row.
_MYSQL_LOCK_ERRORS = frozenset({1205, 3572})


class DatabaseStore(BaseStore):
    """The default store: rows of ``IdempotencyRecord`` on the database ``database``.

    ``IDEMPOTENCY = {"STORE": "database", "STORE_OPTIONS": {"database": "default"}}``.
    Claims join a transaction open around the view, so that the work and its
    stored response commit together; see the module's documentation.
    """

    counts_keys = True

    def __init__(
        self, database: str = DEFAULT_DB_ALIAS, async_claim_commit: bool = False, **options: Any
    ) -> None:
        super().__init__(**options)
        self.alias = database
        self.database_alias = database
        #: PostgreSQL: a claim outside a transaction commits without waiting for
        #: the disk; the work's or the completion's commit flushes it. Off by
        #: default: unsafe behind a pooler in transaction mode (docs/stores.md).
        self.async_claim_commit = async_claim_commit

    # -- the contract -------------------------------------------------------

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        connection = connections[self.alias]
        sql = statements(connection)
        token = uuid.uuid4().hex
        in_transaction = _in_request_transaction(connection)
        wait = in_transaction or not self.async_claim_commit
        with _unavailable_on_error():
            if in_transaction and sql.lock is not None:
                with connection.cursor() as cursor:
                    cursor.execute(sql.lock, [_lock_id(key)])
                    locked = cursor.fetchone()[0]
                if not locked:
                    # Another transaction holds the key: one claiming it, or one
                    # replaying it. A committed, live record answers for itself.
                    row = _read(connection, sql.read, key)
                    if row is None or row.expired:
                        return Claim(Outcome.IN_PROGRESS)
                    return _answer(row, request)
            # A bounded loop: each pass either decides or loses a race to a
            # request that changed the row, which can only happen a few times.
            for _attempt in range(5):
                if in_transaction and sql.read_locked is not None:
                    # MariaDB/MySQL: see an uncommitted claim before inserting.
                    try:
                        row = _read(connection, sql.read_locked, key)
                    except OperationalError as exc:
                        if exc.args and exc.args[0] in _MYSQL_LOCK_ERRORS:
                            return Claim(Outcome.IN_PROGRESS)
                        raise
                    if row is None and _insert(connection, key, request, token, lock_timeout):
                        return Claim(Outcome.CLAIMED, token=token)
                elif _insert(connection, key, request, token, lock_timeout, wait=wait):
                    return Claim(Outcome.CLAIMED, token=token)
                else:
                    row = _read(connection, sql.read, key)
                if row is None:
                    continue  # released or purged since our INSERT: try again
                if row.expired:
                    if _take_over(connection, row, request, token, lock_timeout, wait=wait):
                        return Claim(
                            Outcome.CLAIMED, token=token, took_over=row.state == IN_PROGRESS
                        )
                    continue  # someone else took it over or completed it first
                return _answer(row, request)
        raise StoreUnavailable("The idempotency record kept changing while being claimed.")

    def peek(self, key: RecordKey) -> Outcome | None:
        connection = connections[self.alias]
        with _unavailable_on_error():
            row = _read(connection, statements(connection).read, key)
        if row is None or row.expired:
            return None
        return Outcome.REPLAY if row.state == COMPLETED else Outcome.IN_PROGRESS

    def lookup(self, key: RecordKey) -> KeyState | None:
        connection = connections[self.alias]
        with _unavailable_on_error(), connection.cursor() as cursor:
            cursor.execute(statements(connection).lookup, _scope(key))
            row = cursor.fetchone()
        if row is None:
            return None
        state, status, expires_at, now = row
        expires_in = (
            _datetime(connection, expires_at) - _datetime(connection, now)
        ).total_seconds()
        return KeyState(state=str(state), status=status, expires_in=expires_in)

    def is_held(self, key: RecordKey) -> bool:
        # A reservation made inside another request's transaction is not
        # visible yet: ask for the lock that transaction holds on the key.
        connection = connections[self.alias]
        sql = statements(connection)
        with _unavailable_on_error():
            if not _in_request_transaction(connection):
                if sql.lock is not None:
                    with connection.cursor() as cursor:
                        cursor.execute(sql.lock, [_lock_id(key)])
                        if not cursor.fetchone()[0]:
                            return True
                elif sql.read_locked is not None:
                    try:
                        _read(connection, sql.read_locked, key)
                    except OperationalError as exc:
                        if exc.args and exc.args[0] in _MYSQL_LOCK_ERRORS:
                            return True
                        raise
        return super().is_held(key)

    def complete(
        self,
        key: RecordKey,
        token: str,
        response: StoredResponse,
        retention: int,
        *,
        request: RequestInfo | None = None,
    ) -> bool:
        # Inside the view's transaction when there is one: that is what makes
        # the stored response commit exactly when the work does.
        connection = connections[self.alias]
        sql = statements(connection)
        response = seal(response)
        completed = [
            response.status,
            _json(response.headers),
            bytes(response.body),
            response.body_omitted,
            *later_params(connection, retention),
        ]
        with _unavailable_on_error(), connection.cursor() as cursor:
            cursor.execute(sql.complete, [*completed, *_scope(key), token, IN_PROGRESS])
            if cursor.rowcount:
                return True
            if request is None:
                return False
            # Our reservation is gone (purged after its lock timeout) and
            # nobody claimed the key since: keep the answer of the work that ran.
            return _insert(connection, key, request, token, retention, completed=response)

    def release(self, key: RecordKey, token: str) -> None:
        connection = connections[self.alias]
        with _unavailable_on_error(), connection.cursor() as cursor:
            cursor.execute(statements(connection).release, [*_scope(key), token, IN_PROGRESS])

    def renew(
        self,
        key: RecordKey,
        token: str,
        lock_timeout: int,
        request: RequestInfo,
        *,
        remake: bool = True,
    ) -> bool:
        connection = connections[self.alias]
        params = [*later_params(connection, lock_timeout), *_scope(key), token, IN_PROGRESS]
        with _unavailable_on_error(), connection.cursor() as cursor:
            cursor.execute(statements(connection).renew, params)
            if cursor.rowcount:
                return True
            if not remake:
                return False
            # Our reservation is gone (purged after its lock timeout): make it
            # again, unless another request has claimed the key since.
            return _insert(connection, key, request, token, lock_timeout)

    def count_keys(self, key: RecordKey, lifetime: int) -> tuple[int, float | None]:
        connection = connections[self.alias]
        principal = readable_value(key.principal)
        with _unavailable_on_error(), connection.cursor() as cursor:
            cursor.execute(statements(connection).count_keys, [principal, principal, key.digest])
            count, first_expiry, now = cursor.fetchone()
        if first_expiry is None:
            return max(int(count), 1), None
        first_expiry, now = _datetime(connection, first_expiry), _datetime(connection, now)
        return int(count), (first_expiry - now).total_seconds()

    def clear(self) -> None:
        with _unavailable_on_error():
            IdempotencyRecord.objects.using(self.alias).all().delete()

    def joins_transaction(self) -> bool:
        return _in_request_transaction(connections[self.alias])

    def now(self) -> datetime:
        """The database's clock, as Django reads a datetime column."""
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            # Parameters (none) so that every backend unescapes the SQL's %%.
            cursor.execute(f"SELECT {statements(connection).now}", [])
            return _datetime(connection, cursor.fetchone()[0])

    def check(self) -> list[checks.CheckMessage]:
        if self.alias not in connections.settings:
            return [
                checks.Error(
                    f"IDEMPOTENCY['STORE_OPTIONS']['database'] is {self.alias!r}, "
                    "which is not in DATABASES.",
                    id="idempotency_django.E010",
                )
            ]
        database = connections.settings[self.alias]
        engine = str(database["ENGINE"])
        messages: list[checks.CheckMessage] = []
        name = str(database.get("NAME") or "")
        if engine.endswith("sqlite3") and (name == ":memory:" or "mode=memory" in name):
            messages.append(
                checks.Warning(
                    "The idempotency store uses an in-memory SQLite database, "
                    "which each process sees on its own.",
                    hint="Use a database file or a server database in production.",
                    id="idempotency_django.W010",
                )
            )
        messages.extend(_transaction_checks(self.alias, engine, database))
        if self.async_claim_commit and not engine.endswith("postgresql"):
            messages.append(
                checks.Warning(
                    f"IDEMPOTENCY['STORE_OPTIONS']['async_claim_commit'] is set, but "
                    f"DATABASES[{self.alias!r}] is not PostgreSQL: every claim still "
                    "waits for the disk.",
                    hint="Remove the option: only PostgreSQL commits without waiting.",
                    id="idempotency_django.W013",
                )
            )
        if not settings.USE_TZ and not engine.endswith("postgresql"):
            messages.append(
                checks.Error(
                    "The idempotency database store needs USE_TZ = True on this database: "
                    "it compares expiries with the database's clock in UTC.",
                    hint="Set USE_TZ = True (the default since Django 5.0).",
                    id="idempotency_django.E012",
                )
            )
        return messages


def _transaction_checks(
    alias: str, engine: str, database: dict[str, Any]
) -> list[checks.CheckMessage]:
    """Settings under which claims inside transactions answer 503 instead of 409."""
    from idempotency_django.conf import idempotency_settings

    options = database.get("OPTIONS") or {}
    in_transactions = bool(database.get("ATOMIC_REQUESTS")) or idempotency_settings.ATOMIC
    messages: list[checks.CheckMessage] = []
    mode = str(options.get("transaction_mode") or "DEFERRED").upper()
    if engine.endswith("sqlite3") and in_transactions and mode != "IMMEDIATE":
        messages.append(
            checks.Warning(
                f"DATABASES[{alias!r}] is SQLite with transactions around protected views, "
                "in SQLite's default DEFERRED mode: a duplicate that arrives while the first "
                "request runs gets 503 idempotency_unavailable at once instead of waiting "
                "for it (nothing runs twice either way).",
                hint='Set DATABASES[...]["OPTIONS"]["transaction_mode"] = "IMMEDIATE" '
                "(Django 5.1 or later).",
                id="idempotency_django.W011",
            )
        )
    level = str(options.get("isolation_level") or "").lower().replace("_", " ")
    if in_transactions and ("repeatable" in level or "serializable" in level):
        messages.append(
            checks.Warning(
                f"DATABASES[{alias!r}] runs transactions at {level.split('.')[-1].upper()}: "
                "claims inside them may fail with serialization errors or deadlocks, "
                "and duplicates then get 503 idempotency_unavailable instead of 409.",
                hint="Use READ COMMITTED, Django's default on PostgreSQL and MySQL/MariaDB.",
                id="idempotency_django.W012",
            )
        )
    return messages


# -- rows -------------------------------------------------------------------


class _Row(NamedTuple):
    """The columns of an existing record that decide a claim."""

    pk: int
    token: str
    fingerprint: str
    state: str
    #: Computed by the database: its ``expires_at <= now``.
    expired: bool
    status_code: int | None
    #: JSON text, or a list where the driver decodes JSON itself.
    response_headers: list[list[str]] | str
    response_body: bytes | memoryview
    body_omitted: bool

    def stored_response(self) -> StoredResponse:
        headers = self.response_headers
        if isinstance(headers, str):
            headers = json.loads(headers)
        stored = StoredResponse(
            status=self.status_code or 200,
            headers=tuple((str(name), str(value)) for name, value in headers),
            body=bytes(self.response_body),
            body_omitted=bool(self.body_omitted),
        )
        return unseal(stored)


def _datetime(connection: BaseDatabaseWrapper, value: Any) -> datetime:
    """A datetime the database sent, converted as Django reads ``expires_at``."""
    field = IdempotencyRecord._meta.get_field("expires_at")
    assert isinstance(field, models.DateTimeField)
    column = field.get_col(IdempotencyRecord._meta.db_table)
    converted: datetime = value
    for converter in connection.ops.get_db_converters(column):
        converted = converter(converted, column, connection)
    return converted


def _answer(row: _Row, request: RequestInfo) -> Claim:
    """What a live record another request made answers ``request``."""
    if not same_request(row.fingerprint, request.fingerprint):
        return Claim(Outcome.REUSED)
    if row.state == IN_PROGRESS:
        return Claim(Outcome.IN_PROGRESS)
    return Claim(Outcome.REPLAY, response=row.stored_response())


def _scope(key: RecordKey) -> list[str]:
    """The value of the column that identifies ``key``: its unique digest."""
    return [key.digest]


def _json(headers: tuple[tuple[str, str], ...]) -> str:
    return json.dumps([list(pair) for pair in headers])


def _lock_id(key: RecordKey) -> int:
    """A signed 64-bit number naming ``key`` for PostgreSQL's advisory locks."""
    return int.from_bytes(bytes.fromhex(key.digest[:16]), "big", signed=True)


def _key_values(key: RecordKey) -> list[str]:
    """The values of :data:`~idempotency_django.stores.database_sql.KEY_COLUMNS`."""
    return [key.digest, readable_value(key.principal), readable_value(key.location), key.key]


def _request_values(
    request: RequestInfo,
    token: str,
    completed: StoredResponse | None = None,
) -> list[Any]:
    """The values of :data:`~idempotency_django.stores.database_sql.REQUEST_COLUMNS`, cut."""
    return [
        request.fingerprint[:128],
        request.method,
        request.path[:2048],
        request.request_id[:255],
        request.kind,
        request.source[:64],
        token,
        COMPLETED if completed else IN_PROGRESS,
        completed.status if completed else None,
        _json(completed.headers) if completed else "[]",
        bytes(completed.body) if completed else b"",
        completed.body_omitted if completed else False,
    ]


def _insert(
    connection: BaseDatabaseWrapper,
    key: RecordKey,
    request: RequestInfo,
    token: str,
    seconds: int,
    *,
    completed: StoredResponse | None = None,
    wait: bool = True,
) -> bool:
    """INSERT a reservation (or a completed record) unless the key has a row; True if it did.

    ``wait=False``: on PostgreSQL, its commit does not wait for the disk.
    """
    sql = statements(connection)
    statement = sql.insert_or_nothing if wait else sql.insert_or_nothing_no_wait
    params = [
        *_key_values(key),
        *_request_values(request, token, completed),
        1 if completed is not None else 0,  # completed_at: the database's now, or NULL
        *later_params(connection, seconds),
    ]
    with connection.cursor() as cursor:
        cursor.execute(statement or sql.insert_or_nothing, params)
        return bool(cursor.rowcount)


def _read(connection: BaseDatabaseWrapper, sql: str, key: RecordKey) -> _Row | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, _scope(key))
        row = cursor.fetchone()
    if row is None:
        return None
    return _Row(row[0], row[1], row[2], row[3], bool(row[4]), *row[5:])


def _take_over(
    connection: BaseDatabaseWrapper,
    row: _Row,
    request: RequestInfo,
    token: str,
    lock_timeout: int,
    *,
    wait: bool = True,
) -> bool:
    """Make an expired row our reservation, unless another request changed it first.

    ``wait=False``: on PostgreSQL, its commit does not wait for the disk.
    """
    sql = statements(connection)
    statement = sql.take_over if wait else sql.take_over_no_wait
    values = _request_values(request, token)
    params = [*values, *later_params(connection, lock_timeout), row.pk, row.token, row.state]
    with connection.cursor() as cursor:
        cursor.execute(statement or sql.take_over, params)
        return bool(cursor.rowcount)


def _in_request_transaction(connection: BaseDatabaseWrapper) -> bool:
    """In a transaction other than the one a Django TestCase wraps each test in."""
    return any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


@contextlib.contextmanager
def _unavailable_on_error() -> Iterator[None]:
    try:
        yield
    except Error as exc:
        raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
