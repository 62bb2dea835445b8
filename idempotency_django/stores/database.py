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
The SQL per database, and the values a row is written with, are
:mod:`~idempotency_django.stores.database_sql`'s.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime
from typing import Any, NamedTuple

from django.core import checks
from django.db import DEFAULT_DB_ALIAS, Error, OperationalError, connections, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

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
    in_request_transaction,
    unavailable_on,
)
from idempotency_django.stores.database_checks import database_store_checks
from idempotency_django.stores.database_sql import (
    IN_PROGRESS,
    Statements,
    insert_values,
    later_params,
    request_values,
    response_values,
    statements,
)
from idempotency_django.stores.digests import readable_value, same_request
from idempotency_django.stores.encryption import seal, unseal

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
        self.alias = self.database_alias = database
        #: PostgreSQL: a claim outside a transaction commits without waiting for
        #: the disk; the work's or the completion's commit flushes it. Off by
        #: default: unsafe behind a pooler in transaction mode (docs/stores.md).
        self.async_claim_commit = async_claim_commit

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        connection = connections[self.alias]
        sql = statements(connection)
        token = secrets.token_hex(16)
        in_transaction = in_request_transaction(connection)
        wait = in_transaction or not self.async_claim_commit
        read_first = sql.read_first and not in_transaction
        with unavailable_on(Error):
            lock, insert_if_locked = sql.lock, sql.insert_if_locked
            if in_transaction and lock is not None and insert_if_locked is not None:
                # PostgreSQL: the key's advisory lock, and the INSERT once the lock is
                # ours, in one statement: a new key is claimed in one round trip.
                params = insert_values(connection, key, request, token, lock_timeout)
                if _changed(connection, insert_if_locked, [*params, _lock_id(key)]):
                    return Claim(Outcome.CLAIMED, token=token)
                # A committed, live record answers for itself, whoever holds the lock.
                row = _read(connection, sql.read, key)
                if row is not None and not row.expired:
                    return _answer(row, key, request)
                if _lock_taken(connection, lock, key):  # asked again: ours by now, or not
                    # Another transaction is claiming the key, or taking it over.
                    return Claim(Outcome.IN_PROGRESS)
                # The lock is ours: take the expired row over; a row gone since (released,
                # purged), or taken by a claim made outside a transaction: the loop decides.
                if row is not None and _take_over(connection, row, request, token, lock_timeout):
                    return Claim(Outcome.CLAIMED, token=token, took_over=row.state == IN_PROGRESS)
            # A bounded loop: each pass either decides or loses a race to a
            # request that changed the row, which can only happen a few times.
            for _attempt in range(5):
                if in_transaction and sql.read_locked is not None:
                    # MariaDB/MySQL: see an uncommitted claim before inserting.
                    written, row = _read_nowait(connection, sql.read_locked, key)
                    if written:
                        return Claim(Outcome.IN_PROGRESS)
                    if row is None and _insert(connection, sql, key, request, token, lock_timeout):
                        return Claim(Outcome.CLAIMED, token=token)
                else:
                    # SQLite outside a transaction reads first: a replay need not write.
                    row = _read(connection, sql.read, key) if read_first else None
                    if row is None:
                        if _insert(connection, sql, key, request, token, lock_timeout, wait=wait):
                            return Claim(Outcome.CLAIMED, token=token)
                        row = _read(connection, sql.read, key)
                if row is None:
                    continue  # released or purged since our INSERT: try again
                if row.expired:
                    if _take_over(connection, row, request, token, lock_timeout, wait=wait):
                        return Claim(
                            Outcome.CLAIMED, token=token, took_over=row.state == IN_PROGRESS
                        )
                    continue  # someone else took it over or completed it first
                return _answer(row, key, request)
        raise StoreUnavailable("The idempotency record kept changing while being claimed.")

    def lookup(self, key: RecordKey) -> KeyState | None:
        connection = connections[self.alias]
        with unavailable_on(Error), connection.cursor() as cursor:
            cursor.execute(statements(connection).lookup, [key.digest])
            row = cursor.fetchone()
        if row is None:
            return None
        state, status, expires_at, now = row
        expires_in = read_datetime(connection, expires_at) - read_datetime(connection, now)
        return KeyState(state=str(state), status=status, expires_in=expires_in.total_seconds())

    def peek(self, key: RecordKey) -> Outcome | None:
        held = super().peek(key)
        if held is not None:
            return held
        # A reservation made inside another request's transaction is not visible
        # yet: ask for the lock that transaction holds on the key. PostgreSQL has
        # a lock, MariaDB/MySQL a NOWAIT read; SQLite neither (its writers wait
        # for each other's commit). In a transaction of ours, a free lock is ours
        # until it ends: the key stays free of another's claim while we run.
        connection = connections[self.alias]
        sql = statements(connection)
        with unavailable_on(Error):
            if (sql.lock and _lock_taken(connection, sql.lock, key)) or (
                sql.read_locked and _read_nowait(connection, sql.read_locked, key)[0]
            ):
                return Outcome.IN_PROGRESS
        return None

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
        response = seal(response, key, request.kind if request is not None else "request")
        params = [*response_values(response), *later_params(connection, retention)]
        owned = [key.digest, token, IN_PROGRESS]
        sql = statements(connection)
        with unavailable_on(Error):
            if _changed(connection, sql.complete, [*params, *owned]):
                return True
            # Our reservation is gone (purged after its lock timeout) and
            # nobody claimed the key since: keep the answer of the work that ran.
            return request is not None and _insert(
                connection, sql, key, request, token, retention, completed=response
            )

    def release(self, key: RecordKey, token: str) -> None:
        connection = connections[self.alias]
        with unavailable_on(Error):
            _changed(connection, statements(connection).release, [key.digest, token, IN_PROGRESS])

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
        owned = [key.digest, token, IN_PROGRESS]
        params = [*later_params(connection, lock_timeout), *owned]
        sql = statements(connection)
        if not remake and sql.lock_for_renewal is not None:
            return _renew_without_waiting(connection, sql, owned, params)
        with unavailable_on(Error):
            if _changed(connection, sql.renew, params):
                return True
            # Our reservation is gone (purged after its lock timeout): make it
            # again, unless another request has claimed the key since.
            return remake and _insert(connection, sql, key, request, token, lock_timeout)

    def count_keys(self, key: RecordKey, lifetime: int) -> tuple[int, float | None]:
        connection = connections[self.alias]
        principal = readable_value(key.principal)
        with unavailable_on(Error), connection.cursor() as cursor:
            cursor.execute(statements(connection).count_keys, [principal, principal, key.digest])
            count, first_expiry, now = cursor.fetchone()
        if first_expiry is None:
            return max(int(count), 1), None
        first_expiry, now = read_datetime(connection, first_expiry), read_datetime(connection, now)
        return int(count), (first_expiry - now).total_seconds()

    def clear(self) -> None:
        with unavailable_on(Error):
            IdempotencyRecord.objects.using(self.alias).all().delete()

    def joins_transaction(self) -> bool:
        return in_request_transaction(connections[self.alias])

    def now(self) -> datetime:
        """The database's clock, as Django reads a datetime column."""
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            # Parameters (none) so that every backend unescapes the SQL's %%.
            cursor.execute(f"SELECT {statements(connection).now}", [])
            return read_datetime(connection, cursor.fetchone()[0])

    def check(self) -> list[checks.CheckMessage]:
        return list(database_store_checks(self.alias, self.async_claim_commit))


class Row(NamedTuple):
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

    def stored_response(self, key: RecordKey, kind: str) -> StoredResponse:
        """The answer of the record ``key`` (of ``kind``), opened: it must be that record's."""
        headers = self.response_headers
        if isinstance(headers, str):
            headers = json.loads(headers)
        stored = StoredResponse(
            status=self.status_code or 200,
            headers=tuple((str(name), str(value)) for name, value in headers),
            body=bytes(self.response_body),
            body_omitted=bool(self.body_omitted),
        )
        return unseal(stored, key, kind)


def read_datetime(connection: BaseDatabaseWrapper, value: Any) -> datetime:
    """A datetime the database sent, converted as Django reads ``expires_at``."""
    field = IdempotencyRecord._meta.get_field("expires_at")
    assert isinstance(field, models.DateTimeField)
    column = field.get_col(IdempotencyRecord._meta.db_table)
    converted: datetime = value
    for converter in connection.ops.get_db_converters(column):
        converted = converter(converted, column, connection)
    return converted


def _answer(row: Row, key: RecordKey, request: RequestInfo) -> Claim:
    """What a live record another request made answers ``request``."""
    if not same_request(row.fingerprint, request.fingerprint):
        return Claim(Outcome.REUSED)
    if row.state == IN_PROGRESS:
        return Claim(Outcome.IN_PROGRESS)
    return Claim(Outcome.REPLAY, response=row.stored_response(key, request.kind))


def _lock_taken(connection: BaseDatabaseWrapper, lock: str, key: RecordKey) -> bool:
    """PostgreSQL: True when another transaction holds ``key``'s advisory lock (else we hold it)."""
    with connection.cursor() as cursor:
        cursor.execute(lock, [_lock_id(key)])
        return not cursor.fetchone()[0]


def _lock_id(key: RecordKey) -> int:
    """The name of ``key``'s advisory lock: a signed 64-bit number made of its digest."""
    return int.from_bytes(bytes.fromhex(key.digest[:16]), "big", signed=True)


def _read_nowait(
    connection: BaseDatabaseWrapper, read_locked: str, key: RecordKey
) -> tuple[bool, Row | None]:
    """MariaDB/MySQL: whether another transaction is writing ``key``'s row, else the row.

    (True, None) when the NOWAIT read is refused; (False, the row or None) otherwise.
    """
    try:
        return False, _read(connection, read_locked, key)
    except OperationalError as exc:
        if exc.args and exc.args[0] in _MYSQL_LOCK_ERRORS:
            return True, None
        raise


def _renew_without_waiting(
    connection: BaseDatabaseWrapper, sql: Statements, owned: list[Any], params: list[Any]
) -> bool:
    """The heartbeat's renewal: a row another transaction holds raises StoreUnavailable.

    A retry that took the key over inside its transaction holds the row until it
    ends; an UPDATE would wait as long, and the heartbeat's other renewals with it.
    """
    assert sql.lock_for_renewal is not None
    with unavailable_on(Error), transaction.atomic(using=connection.alias):
        with connection.cursor() as cursor:
            cursor.execute(sql.lock_for_renewal, owned)
            if cursor.fetchone() is None:
                return False
        return _changed(connection, sql.renew, params)


def _insert(
    connection: BaseDatabaseWrapper,
    sql: Statements,
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
    statement = sql.insert_or_nothing if wait else sql.insert_or_nothing_no_wait
    params = insert_values(connection, key, request, token, seconds, completed)
    return _changed(connection, statement, params)


def _read(connection: BaseDatabaseWrapper, sql: str, key: RecordKey) -> Row | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, [key.digest])
        row = cursor.fetchone()
    if row is None:
        return None
    return Row(row[0], row[1], row[2], row[3], bool(row[4]), *row[5:])


def _take_over(
    connection: BaseDatabaseWrapper,
    row: Row,
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
    values = request_values(request, token)
    params = [*values, *later_params(connection, lock_timeout), row.pk, row.token, row.state]
    return _changed(connection, sql.take_over if wait else sql.take_over_no_wait, params)


def _changed(connection: BaseDatabaseWrapper, statement: str, params: list[Any]) -> bool:
    """Run one INSERT, UPDATE or DELETE; True if it changed a row."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return bool(cursor.rowcount)
