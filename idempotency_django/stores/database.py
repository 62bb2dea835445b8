"""The default store: one row per key in :class:`~idempotency_django.models.IdempotencyRecord`.

The claim is an INSERT guarded by a unique constraint, so two requests can
never both own a key. It must be visible to other requests at once, even
when the view runs inside a transaction (``ATOMIC_REQUESTS``): then claims
and releases go through a second, autocommit connection to the same
database, while the completion joins the view's transaction, so the work
and its stored response commit (or roll back) together. On PostgreSQL the
reservation's commit does not wait for the disk (see ``_insert_or_read``).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.core import checks
from django.core.signals import request_finished, request_started
from django.db import DEFAULT_DB_ALIAS, Error, IntegrityError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend
from django.utils import timezone
from django.utils.connection import ConnectionDoesNotExist

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores.base import (
    BaseStore,
    Claim,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
)

SIDE_ALIAS_SUFFIX = "__idempotency"
#: Side aliases some thread of this process has opened.
_side_aliases: set[str] = set()

State = IdempotencyRecord.State
IN_PROGRESS = str(State.IN_PROGRESS)


class DatabaseStore(BaseStore):
    supports_atomic = True

    def __init__(self, database: str = DEFAULT_DB_ALIAS, **options: Any) -> None:
        super().__init__(**options)
        self.alias = database

    # -- the contract -------------------------------------------------------

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        using = self._visible_alias()
        token = uuid.uuid4().hex
        with _unavailable_on_error():
            # A bounded loop: each pass either decides or loses a race to a
            # request that changed the row, which can only happen a few times.
            for _attempt in range(5):
                now = timezone.now()
                fields = _reservation_fields(request, token, now, lock_timeout)
                inserted, existing = _insert_or_read(using, key, fields)
                if inserted:
                    return Claim(Outcome.CLAIMED, token=token)
                if existing is None:
                    continue  # purged or released since our INSERT: try again
                if existing.expires_at <= now:
                    # Expired record or abandoned reservation: take it over,
                    # unless someone else just did (compare the owner token).
                    records = IdempotencyRecord.objects.using(using)
                    if records.filter(pk=existing.pk, token=existing.token).update(**fields):
                        took_over = existing.state == IN_PROGRESS
                        return Claim(Outcome.CLAIMED, token=token, took_over=took_over)
                    continue
                if existing.fingerprint != request.fingerprint:
                    return Claim(Outcome.REUSED)
                if existing.state == IN_PROGRESS:
                    return Claim(Outcome.IN_PROGRESS)
                return Claim(Outcome.REPLAY, response=existing.stored_response())
        raise StoreUnavailable("The idempotency record kept changing while being claimed.")

    def peek(self, key: RecordKey) -> Outcome | None:
        with _unavailable_on_error():
            state = (
                IdempotencyRecord.objects.using(self._visible_alias())
                .filter(**_scope(key), expires_at__gt=timezone.now())
                .values_list("state", flat=True)
                .first()
            )
        if state is None:
            return None
        return Outcome.REPLAY if state == State.COMPLETED else Outcome.IN_PROGRESS

    def complete(
        self,
        key: RecordKey,
        token: str,
        response: StoredResponse,
        retention: int,
        *,
        request: RequestInfo | None = None,
    ) -> bool:
        # The request's own connection: inside the view's transaction when
        # there is one, which is what makes the stored response exactly-once.
        now = timezone.now()
        completed = _completion_fields(response, now, retention)
        records = IdempotencyRecord.objects.using(self.alias)
        scope = _scope(key)
        with _unavailable_on_error():
            if _complete_reservation(self.alias, key, token, completed):
                return True
            if request is None or records.filter(**scope).exists():
                return False
            # Our reservation was purged after its lock timeout and nobody
            # claimed the key since: keep the answer of the work that ran.
            try:
                with _savepoint_if_in_transaction(self.alias):
                    records.create(
                        **scope,
                        **completed,
                        **_request_fields(request),
                        token=token,
                        created_at=now,
                    )
            except IntegrityError:
                return False  # someone claimed it meanwhile
        return True

    def release(self, key: RecordKey, token: str) -> None:
        with _unavailable_on_error():
            IdempotencyRecord.objects.using(self._visible_alias()).filter(
                **_scope(key), token=token, state=State.IN_PROGRESS
            ).delete()

    def atomic(self) -> Any:
        return transaction.atomic(using=self.alias)

    def in_transaction(self) -> bool:
        return _in_request_transaction(connections[self.alias])

    def in_rolled_back_transaction(self) -> bool:
        connection = connections[self.alias]
        return _in_request_transaction(connection) and bool(connection.needs_rollback)

    def check(self) -> list[checks.CheckMessage]:
        if self.alias not in connections.settings:
            return [
                checks.Error(
                    f"IDEMPOTENCY['STORE_OPTIONS']['database'] is {self.alias!r}, "
                    "which is not in DATABASES.",
                    id="idempotency_django.E010",
                )
            ]
        name = str(connections.settings[self.alias].get("NAME") or "")
        if connections.settings[self.alias]["ENGINE"].endswith("sqlite3") and (
            name == ":memory:" or "mode=memory" in name
        ):
            return [
                checks.Warning(
                    "The idempotency store uses an in-memory SQLite database, "
                    "which each process sees on its own.",
                    hint="Use a database file or a server database in production.",
                    id="idempotency_django.W010",
                )
            ]
        return []

    # -- connections --------------------------------------------------------

    def _visible_alias(self) -> str:
        """An alias whose writes other requests see at once.

        The request's connection when it is in autocommit mode; otherwise a
        second connection, except on SQLite, which has a single writer: there
        the claim joins the transaction and duplicates wait for its commit.
        """
        connection = connections[self.alias]
        if connection.vendor == "sqlite" or not _in_request_transaction(connection):
            return self.alias
        return _side_alias(self.alias)


def _scope(key: RecordKey) -> dict[str, str]:
    """The record's columns that identify ``key``: the unique constraint."""
    return {"principal": key.principal, "location": key.location, "key": key.key}


def _request_fields(request: RequestInfo) -> dict[str, Any]:
    """The record's columns that describe the request, cut to their lengths."""
    return {
        "fingerprint": request.fingerprint,
        "method": request.method,
        "path": request.path[:2048],
        "request_id": request.request_id[:255],
        "kind": request.kind,
        "source": request.source[:64],
    }


def _reservation_fields(
    request: RequestInfo, token: str, now: datetime, lock_timeout: int
) -> dict[str, Any]:
    """The columns of a new reservation, but for its key."""
    return {
        **_request_fields(request),
        "state": State.IN_PROGRESS,
        "token": token,
        "status_code": None,
        "response_headers": [],
        "response_body": b"",
        "created_at": now,
        "completed_at": None,
        "expires_at": now + timedelta(seconds=lock_timeout),
    }


def _completion_fields(response: StoredResponse, now: datetime, retention: int) -> dict[str, Any]:
    """What complete() sets on the reservation."""
    return {
        "state": State.COMPLETED,
        "status_code": response.status,
        "response_headers": [list(pair) for pair in response.headers],
        "response_body": response.body,
        "completed_at": now,
        "expires_at": now + timedelta(seconds=retention),
    }


#: The record's columns an INSERT writes, in the order of the statements below.
_INSERT_FIELDS = (
    "principal",  # principal, location, key: the unique constraint
    "location",
    "key",
    "fingerprint",
    "method",
    "path",
    "request_id",
    "kind",
    "source",
    "state",
    "token",
    "status_code",
    "response_headers",
    "response_body",
    "created_at",
    "completed_at",
    "expires_at",
)
#: What complete() sets.
_COMPLETE_FIELDS = (
    "state",
    "status_code",
    "response_headers",
    "response_body",
    "completed_at",
    "expires_at",
)
_FIELDS = {field.name: field for field in IdempotencyRecord._meta.concrete_fields}


class _Row(NamedTuple):
    """The columns of an existing record that decide a claim."""

    pk: int
    token: str
    fingerprint: str
    state: str
    expires_at: datetime
    status_code: int | None
    #: A list, or its JSON text when read with SQL (Django leaves JSON decoding to the field).
    response_headers: list[list[str]] | str
    response_body: bytes | memoryview

    def stored_response(self) -> StoredResponse:
        headers = self.response_headers
        if isinstance(headers, str):
            headers = json.loads(headers)
        return StoredResponse(
            status=self.status_code or 200,
            headers=tuple((str(name), str(value)) for name, value in headers),
            body=bytes(self.response_body),
        )


@dataclass(frozen=True)
class _Statements:
    """The SQL of every request's path, built once per database vendor.

    The ORM would compile the same statements again on every request, which
    costs about as much as the round trip itself.
    """

    #: The claim's ``INSERT ... ON CONFLICT DO NOTHING``, where the database has it.
    claim: str | None
    #: PostgreSQL: the same claim, committing without waiting for the WAL flush.
    claim_unflushed: str | None
    #: PostgreSQL: the read of an existing row after the claim inserted nothing.
    #: (Elsewhere the ORM reads it: it converts SQLite's datetimes.)
    read: str | None
    complete: str


_statements_by_vendor: dict[str, _Statements] = {}


def _statements(connection: BaseDatabaseWrapper) -> _Statements:
    try:
        return _statements_by_vendor[connection.vendor]
    except KeyError:
        pass
    quote = connection.ops.quote_name
    table = quote(IdempotencyRecord._meta.db_table)

    def column(name: str) -> str:
        return quote(str(_FIELDS[name].column))

    where_key = " AND ".join(f"{column(name)} = %s" for name in _INSERT_FIELDS[:3])
    features = connection.features
    claim = claim_unflushed = read = None
    if (
        connection.vendor in ("postgresql", "sqlite")
        and features.supports_update_conflicts_with_target
        and features.can_return_rows_from_bulk_insert
    ):
        into = f"INSERT INTO {table} ({', '.join(map(column, _INSERT_FIELDS))})"
        placeholders = ", ".join(["%s"] * len(_INSERT_FIELDS))
        conflict = (
            f"ON CONFLICT ({', '.join(map(column, _INSERT_FIELDS[:3]))}) DO NOTHING "
            f"RETURNING {column('id')}"
        )
        claim = f"{into} VALUES ({placeholders}) {conflict}"
        if connection.vendor == "postgresql":
            # set_config(..., true) lasts until the end of this statement's own
            # transaction (autocommit). Other requests see the row at once, as
            # before; only the commit's wait for the disk is skipped.
            claim_unflushed = (
                f"{into} SELECT {placeholders} "
                "FROM (SELECT set_config('synchronous_commit', 'off', true)) AS unflushed "
                f"{conflict}"
            )
            read = (
                f"SELECT {', '.join(map(column, ['id', *_Row._fields[1:]]))} "
                f"FROM {table} WHERE {where_key}"
            )
    complete = (
        f"UPDATE {table} SET {', '.join(f'{column(name)} = %s' for name in _COMPLETE_FIELDS)} "
        f"WHERE {where_key} AND {column('token')} = %s AND {column('state')} = %s"
    )
    statements = _Statements(claim, claim_unflushed, read, complete)
    _statements_by_vendor[connection.vendor] = statements
    return statements


def _params(
    connection: BaseDatabaseWrapper, names: tuple[str, ...], values: dict[str, Any]
) -> list[Any]:
    return [_FIELDS[name].get_db_prep_save(values[name], connection) for name in names]


def _insert_params(
    connection: BaseDatabaseWrapper, key: RecordKey, fields: dict[str, Any]
) -> list[Any]:
    """The parameters of the ``claim`` statements, in their order."""
    return _params(connection, _INSERT_FIELDS, {**_scope(key), **fields})


def _insert_or_read(using: str, key: RecordKey, fields: dict[str, Any]) -> tuple[bool, _Row | None]:
    """INSERT the row unless the key exists: (True, None) when it did, else (False, the row).

    The row is None when it vanished meanwhile (released or purged).
    Where the database can, the INSERT is ``INSERT ... ON CONFLICT DO NOTHING``:
    no failed statement, so no "duplicate key" error (with the key in it) in
    the database server's log on every replay, and no savepoint. Elsewhere an
    INSERT whose unique violation is caught.

    On PostgreSQL in autocommit mode the reservation's commit does not wait
    for its WAL to reach the disk. That is safe because WAL is flushed in
    order: the next durable commit on the server (the view's own, or
    complete()'s) flushes the reservation with it, so no work or stored
    response is ever durable without it. A server crash before then loses the
    reservation, and the work of that request with it, which only lets a
    retry run sooner than the lock timeout would.
    """
    connection = connections[using]
    statements = _statements(connection)
    scope = _scope(key)
    if statements.claim is None:
        try:
            with _savepoint_if_in_transaction(using):
                IdempotencyRecord.objects.using(using).create(**scope, **fields)
        except IntegrityError:
            return False, _read(using, scope)
        return True, None
    sql = statements.claim
    if statements.claim_unflushed is not None and not connection.in_atomic_block:
        sql = statements.claim_unflushed
    params = _insert_params(connection, key, fields)
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(sql, params)
        if cursor.fetchone() is not None:
            return True, None
        if statements.read is not None:
            cursor.execute(statements.read, params[:3])
            row = cursor.fetchone()
            return False, None if row is None else _Row(*row)
    return False, _read(using, scope)


def _read(using: str, scope: dict[str, str]) -> _Row | None:
    values = (
        IdempotencyRecord.objects.using(using).filter(**scope).values_list(*_Row._fields).first()
    )
    return None if values is None else _Row(*values)


def _complete_reservation(
    using: str, key: RecordKey, token: str, completed: dict[str, Any]
) -> bool:
    """Store the response in the reservation ``token`` still owns; False when it does not."""
    connection = connections[using]
    params = _complete_params(connection, key, token, completed)
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(_statements(connection).complete, params)
        return bool(cursor.rowcount)


def _complete_params(
    connection: BaseDatabaseWrapper, key: RecordKey, token: str, completed: dict[str, Any]
) -> list[Any]:
    """The parameters of the ``complete`` statement, in its order."""
    return [
        *_params(connection, _COMPLETE_FIELDS, completed),
        key.principal,
        key.location,
        key.key,
        token,
        IN_PROGRESS,
    ]


def _in_request_transaction(connection: BaseDatabaseWrapper) -> bool:
    """In a transaction other than the one a Django TestCase wraps each test in."""
    return any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


def _savepoint_if_in_transaction(using: str) -> contextlib.AbstractContextManager[Any]:
    # Autocommit needs no savepoint around an INSERT that may fail; skipping
    # it saves two round trips on the hot path.
    if connections[using].in_atomic_block:
        return transaction.atomic(using=using)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _unavailable_on_error() -> Iterator[None]:
    try:
        yield
    except Error as exc:
        raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc


def _side_alias(alias: str) -> str:
    """This thread's autocommit connection to ``alias``, registered as ``alias__idempotency``."""
    side = alias + SIDE_ALIAS_SUFFIX
    try:
        connections[side]
    except ConnectionDoesNotExist:
        settings_dict = connections.settings[alias]
        backend = load_backend(settings_dict["ENGINE"])
        connections[side] = backend.DatabaseWrapper(settings_dict, side)
        _side_aliases.add(side)
    return side


def close_side_connections(**kwargs: Any) -> None:
    """Close this thread's side connections that Django would close for the main ones.

    Connected to ``request_started``/``request_finished`` like Django's own
    ``close_old_connections``; call it directly from threads you start.
    """
    if not _side_aliases:
        return  # the common case: this process never needed one
    force = kwargs.get("force", False)
    for alias in tuple(_side_aliases):  # another thread may be adding one
        try:
            connection = connections[alias]
        except ConnectionDoesNotExist:  # made by another thread
            continue
        if force:
            connection.close()
        else:
            connection.close_if_unusable_or_obsolete()


def connect_signals() -> None:
    request_started.connect(close_side_connections, dispatch_uid="idempotency_side_connections")
    request_finished.connect(close_side_connections, dispatch_uid="idempotency_side_connections_f")
