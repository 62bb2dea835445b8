"""The database store's rows: the values a record is read back as (written: database_sql's)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NamedTuple

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores.base import RecordKey, StoredResponse
from idempotency_django.stores.database_sql import IN_PROGRESS, headers_json, insert_values
from idempotency_django.stores.encryption import unseal

# benchmarks/inprocess.py sends the store's own INSERT and completion with these, by this name.
__all__ = ["IN_PROGRESS", "Row", "headers_json", "insert_values", "read_datetime"]


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
