"""The database store's rows: the values a record is written with, and read back as."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NamedTuple

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores.base import RecordKey, RequestInfo, StoredResponse
from idempotency_django.stores.database_sql import later_params
from idempotency_django.stores.digests import readable_value
from idempotency_django.stores.encryption import unseal

State = IdempotencyRecord.State
IN_PROGRESS = str(State.IN_PROGRESS)
COMPLETED = str(State.COMPLETED)


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


def headers_json(headers: tuple[tuple[str, str], ...]) -> str:
    """The stored headers as the JSON text of the ``response_headers`` column."""
    return json.dumps([list(pair) for pair in headers])


def key_values(key: RecordKey) -> list[str]:
    """The values of :data:`~idempotency_django.stores.database_sql.KEY_COLUMNS`."""
    return [key.digest, readable_value(key.principal), readable_value(key.location), key.key]


def request_values(
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
        headers_json(completed.headers) if completed else "[]",
        bytes(completed.body) if completed else b"",
        completed.body_omitted if completed else False,
    ]


def insert_values(
    connection: BaseDatabaseWrapper,
    key: RecordKey,
    request: RequestInfo,
    token: str,
    seconds: int,
    completed: StoredResponse | None = None,
) -> list[Any]:
    """The parameters of an INSERT: a reservation, or a completed record, for ``seconds``."""
    return [
        *key_values(key),
        *request_values(request, token, completed),
        1 if completed is not None else 0,  # completed_at: the database's now, or NULL
        *later_params(connection, seconds),
    ]
