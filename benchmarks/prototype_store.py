"""A prototype of two suggested changes to ``DatabaseStore.claim``, to measure them.

Not part of the library: the benchmark's ``postgres_proto`` variant selects it
(``BENCH_PROTOTYPE_STORE=1``). On PostgreSQL in autocommit mode, the common
paths of a claim become one statement, so one round trip:

1. claim-or-read: ``INSERT ... ON CONFLICT DO NOTHING RETURNING``, and in the
   same statement the existing row when the INSERT did nothing. No failed
   INSERT, so no exception, no dead heap tuple and no ``ERROR: duplicate key``
   line (with the statement) in the server log per replay (the id sequence
   still advances: PostgreSQL evaluates the default before the conflict check);
2. the reservation commits with ``synchronous_commit`` off for that
   transaction only (``set_config(..., true)``): it is visible to other
   sessions at once, as before, but its commit does not wait for a WAL flush.
   That is safe because WAL is flushed in order: the view's own commit, or
   ``complete()``'s (still synchronous), flushes the reservation with it. A
   crash before either loses at most the reservation, which only lets a retry
   run, as a crash before ``complete()`` already does today.

Everything else (an expired record to take over, a row that vanished, any
other vendor or an open transaction) goes through the library's own code.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

from django.db import connections
from django.utils import timezone

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import Claim, Outcome, RecordKey, RequestInfo, StoredResponse
from idempotency_django.stores.database import DatabaseStore, _unavailable_on_error

TABLE = IdempotencyRecord._meta.db_table
CLAIM_SQL = f"""
WITH cfg AS (SELECT set_config('synchronous_commit', 'off', true) AS setting),
ins AS (
  INSERT INTO {TABLE} (kind, source, principal, location, key, fingerprint, method, path,
    request_id, state, token, status_code, response_headers, response_body, created_at,
    completed_at, expires_at)
  SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, 'in_progress', %s, NULL, '[]'::jsonb, ''::bytea,
    %s, NULL, %s FROM cfg
  ON CONFLICT (principal, location, key) DO NOTHING
  RETURNING id
)
SELECT true, NULL, NULL, NULL, NULL, NULL::jsonb, NULL::bytea FROM ins
UNION ALL
SELECT false, fingerprint, state, expires_at, status_code, response_headers, response_body
FROM {TABLE}
WHERE principal = %s AND location = %s AND key = %s AND NOT EXISTS (SELECT 1 FROM ins)
"""


class PrototypeStore(DatabaseStore):
    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        using = self._visible_alias()
        connection = connections[using]
        if connection.vendor != "postgresql" or connection.in_atomic_block:
            return super().claim(key, request, lock_timeout)
        token = uuid.uuid4().hex
        now = timezone.now()
        params = [
            request.kind,
            request.source[:64],
            key.principal,
            key.location,
            key.key,
            request.fingerprint,
            request.method,
            request.path[:2048],
            request.request_id[:255],
            token,
            now,
            now + timedelta(seconds=lock_timeout),
            key.principal,
            key.location,
            key.key,
        ]
        with _unavailable_on_error(), connection.cursor() as cursor:
            cursor.execute(CLAIM_SQL, params)
            row = cursor.fetchone()
        if row is None:  # released or purged between the INSERT and the read
            return super().claim(key, request, lock_timeout)
        claimed, fingerprint, state, expires_at, status, headers, body = row
        if claimed:
            return Claim(Outcome.CLAIMED, token=token)
        if expires_at <= now:  # take over: the library's compare-and-swap path
            return super().claim(key, request, lock_timeout)
        if fingerprint != request.fingerprint:
            return Claim(Outcome.REUSED)
        if state == IdempotencyRecord.State.IN_PROGRESS:
            return Claim(Outcome.IN_PROGRESS)
        pairs: Any = json.loads(headers) if isinstance(headers, str) else headers
        return Claim(
            Outcome.REPLAY,
            response=StoredResponse(
                status=status or 200,
                headers=tuple((str(name), str(value)) for name, value in pairs),
                body=bytes(body),
            ),
        )
