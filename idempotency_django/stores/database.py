"""The default store: one row per key in :class:`~idempotency_django.models.IdempotencyRecord`.

The claim is an INSERT guarded by a unique constraint, so two requests can
never both own a key. It must be visible to other requests at once, even
when the view runs inside a transaction (``ATOMIC_REQUESTS``): then claims
and releases go through a second, autocommit connection to the same
database, while the completion joins the view's transaction, so the work
and its stored response commit (or roll back) together.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

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


class DatabaseStore(BaseStore):
    supports_atomic = True

    def __init__(self, database: str = DEFAULT_DB_ALIAS, **options: Any) -> None:
        super().__init__(**options)
        self.alias = database

    # -- the contract -------------------------------------------------------

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        using = self._visible_alias()
        records = IdempotencyRecord.objects.using(using)
        token = uuid.uuid4().hex
        with _unavailable_on_error():
            # A bounded loop: each pass either decides or loses a race to a
            # request that changed the row, which can only happen a few times.
            for _attempt in range(5):
                now = timezone.now()
                fields: dict[str, Any] = {
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
                if _insert_if_absent(using, key, fields):
                    return Claim(Outcome.CLAIMED, token=token)
                existing = next(
                    iter(
                        records.filter(principal=key.principal, location=key.location, key=key.key)[
                            :1
                        ]
                    ),
                    None,
                )
                if existing is None:
                    continue  # purged or released since our INSERT: try again
                if existing.expires_at <= now:
                    # Expired record or abandoned reservation: take it over,
                    # unless someone else just did (compare the owner token).
                    if records.filter(pk=existing.pk, token=existing.token).update(**fields):
                        took_over = existing.state == State.IN_PROGRESS
                        return Claim(Outcome.CLAIMED, token=token, took_over=took_over)
                    continue
                if existing.fingerprint != request.fingerprint:
                    return Claim(Outcome.REUSED)
                if existing.state == State.IN_PROGRESS:
                    return Claim(Outcome.IN_PROGRESS)
                return Claim(Outcome.REPLAY, response=_stored_response(existing))
        raise StoreUnavailable("The idempotency record kept changing while being claimed.")

    def peek(self, key: RecordKey) -> Outcome | None:
        with _unavailable_on_error():
            state = (
                IdempotencyRecord.objects.using(self._visible_alias())
                .filter(
                    principal=key.principal,
                    location=key.location,
                    key=key.key,
                    expires_at__gt=timezone.now(),
                )
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
        completed: dict[str, Any] = {
            "state": State.COMPLETED,
            "status_code": response.status,
            "response_headers": [list(pair) for pair in response.headers],
            "response_body": response.body,
            "completed_at": now,
            "expires_at": now + timedelta(seconds=retention),
        }
        records = IdempotencyRecord.objects.using(self.alias)
        scope = {"principal": key.principal, "location": key.location, "key": key.key}
        with _unavailable_on_error():
            if records.filter(**scope, token=token, state=State.IN_PROGRESS).update(**completed):
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
                principal=key.principal,
                location=key.location,
                key=key.key,
                token=token,
                state=State.IN_PROGRESS,
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


def _insert_if_absent(using: str, key: RecordKey, fields: dict[str, Any]) -> bool:
    """INSERT the row unless the key exists; True when it was inserted.

    Where the database can, one ``INSERT ... ON CONFLICT DO NOTHING RETURNING``
    statement: no failed statement, so no "duplicate key" error (with the key in
    it) in the database server's log on every replay, and no savepoint.
    Elsewhere an INSERT whose unique violation is caught.
    """
    connection = connections[using]
    features = connection.features
    if not (
        connection.vendor in ("postgresql", "sqlite")
        and features.supports_update_conflicts_with_target
        and features.can_return_rows_from_bulk_insert
    ):
        try:
            with _savepoint_if_in_transaction(using):
                IdempotencyRecord.objects.using(using).create(
                    principal=key.principal, location=key.location, key=key.key, **fields
                )
        except IntegrityError:
            return False
        return True
    opts = IdempotencyRecord._meta
    quote = connection.ops.quote_name
    fields_by_name = {field.name: field for field in opts.concrete_fields}
    values = {"principal": key.principal, "location": key.location, "key": key.key, **fields}
    columns = [quote(str(fields_by_name[name].column)) for name in values]
    params = [
        fields_by_name[name].get_db_prep_save(value, connection) for name, value in values.items()
    ]
    unique = ", ".join(columns[:3])  # principal, location, key: the unique constraint
    sql = (
        f"INSERT INTO {quote(opts.db_table)} ({', '.join(columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))}) "
        f"ON CONFLICT ({unique}) DO NOTHING RETURNING {quote(str(opts.pk.column))}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() is not None


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


def _stored_response(record: IdempotencyRecord) -> StoredResponse:
    return StoredResponse(
        status=record.status_code or 200,
        headers=tuple((str(name), str(value)) for name, value in record.response_headers),
        body=bytes(record.response_body),
    )


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
