"""Growth (PostgreSQL): replay and first-request latency as the table fills; memory per record.

Run by ``overhead.py`` in a child process (database store on PostgreSQL, see
``_bench.child_env``). Bulk-loads completed records with a 1 KB JSON response by
``COPY``, steps through ``--sizes``, measures at each size, prints
``EXPLAIN (ANALYZE, BUFFERS)`` of the claim's statements at the largest, and
measures bytes per record in PostgreSQL and in Redis.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _bench, inprocess

TABLE = "idempotency_django_idempotencyrecord"
#: A typical 1 KB JSON response body (a booking with some nested detail).
BODY_1KB = json.dumps(
    {
        "id": 123456,
        "slot": "2026-07-30T09:00:00Z",
        "customer": "Dana Whitfield",
        "location": "portland",
        "notes": "x" * 820,
        "links": {"self": "/api/bookings/123456/", "cancel": "/api/bookings/123456/"},
    },
    separators=(",", ":"),
).encode()
HEADERS = [["Content-Type", "application/json"], ["Vary", "Accept"], ["Allow", "GET, POST"]]


def bulk_load(start: int, stop: int) -> float:
    """COPY records ``start..stop`` (spread over 1000 principals); returns seconds."""
    import psycopg
    from psycopg.types.json import Jsonb

    started = time.perf_counter()
    now = datetime.now(timezone.utc)
    expires = now + timedelta(days=1)
    headers = Jsonb(HEADERS)
    columns = (
        "kind, source, principal, location, key, fingerprint, method, path, request_id, state, "
        "token, status_code, response_headers, response_body, created_at, completed_at, expires_at"
    )
    with psycopg.connect(
        host=_bench.PG_HOST, port=_bench.PG_PORT, user=_bench.PG_USER, dbname=_bench.PG_DB
    ) as conn:
        with conn.cursor() as cursor, cursor.copy(f"COPY {TABLE} ({columns}) FROM STDIN") as copy:
            for index in range(start, stop):
                copy.write_row(
                    (
                        "request",
                        "",
                        f"auth.user:{100000 + index % 1000}",
                        "portland",
                        uuid.uuid4().hex,
                        uuid.uuid4().hex + uuid.uuid4().hex,
                        "POST",
                        "/api/bookings/",
                        "",
                        "completed",
                        uuid.uuid4().hex,
                        201,
                        headers,
                        BODY_1KB,
                        now,
                        now,
                        expires,
                    )
                )
        conn.commit()
        conn.autocommit = True
        conn.execute(f"VACUUM ANALYZE {TABLE}")
    return time.perf_counter() - started


def table_bytes() -> dict[str, float]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT pg_total_relation_size('{TABLE}'), pg_relation_size('{TABLE}'), "
            f"pg_indexes_size('{TABLE}'), (SELECT count(*) FROM {TABLE})"
        )
        total, heap, indexes, rows = cursor.fetchone()
    return {
        "rows": rows,
        "total_bytes": total,
        "bytes_per_row": total / rows,
        "heap_bytes_per_row": heap / rows,
        "index_bytes_per_row": indexes / rows,
    }


def explain(requests: dict[str, Any]) -> dict[str, str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the statements a first request and a replay send."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    plans: dict[str, str] = {}
    with CaptureQueriesContext(connection) as first:
        requests["first"]()
    with CaptureQueriesContext(connection) as replay:
        requests["replay"]()
    claim = next(q["sql"] for q in first.captured_queries if "ON CONFLICT" in q["sql"])
    update = next(q["sql"] for q in first.captured_queries if q["sql"].startswith("UPDATE"))
    replay_claim = next(q["sql"] for q in replay.captured_queries if "ON CONFLICT" in q["sql"])
    replay_read = next(
        q["sql"]
        for q in replay.captured_queries
        if q["sql"].startswith("SELECT") and "idempotency_django_idempotencyrecord" in q["sql"]
    )
    fresh = uuid.uuid4().hex
    statements = {
        # The claim of a new key, with a key nobody holds (rolled back).
        "claim (new key)": claim.replace("'first-", f"'explain-{fresh}-", 1),
        # The claim of a key whose response is stored: inserts nothing...
        "claim (existing key)": replay_claim,
        # ...so the stored row is read.
        "claim's read (existing key)": replay_read,
        # complete(): the owner's UPDATE (rolled back).
        "complete UPDATE": update,
    }
    with connection.cursor() as cursor:
        for label, sql in statements.items():
            cursor.execute("BEGIN")
            try:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                plans[label] = "\n".join(row[0] for row in cursor.fetchall())
            finally:
                cursor.execute("ROLLBACK")
    return plans


def redis_bytes_per_record() -> dict[str, Any]:
    """``MEMORY USAGE`` of one completed entry holding the 1 KB response."""
    import redis

    from idempotency_django.stores import RecordKey, RequestInfo, StoredResponse
    from idempotency_django.stores.redis import RedisStore

    store = RedisStore(cache="bench_redis")
    key = RecordKey("auth.user:1", "portland", "memory-" + uuid.uuid4().hex)
    info = RequestInfo(method="POST", path="/api/bookings/", fingerprint="f" * 64)
    claim = store.claim(key, info, 300)
    response = StoredResponse(201, tuple((name, value) for name, value in HEADERS), BODY_1KB)
    assert store.complete(key, claim.token, response, 86400)
    server = redis.Redis.from_url(_bench.REDIS_URL)
    usage = int(server.memory_usage(store.redis_key(key), samples=0) or 0)
    length = int(server.strlen(store.redis_key(key)))
    server.delete(store.redis_key(key))
    return {"memory_usage_bytes": usage, "value_bytes": length, "body_bytes": len(BODY_1KB)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("-n", type=int, default=150)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]

    _bench.setup_django()
    from django.conf import settings
    from django.db import connection

    settings.CACHES["bench_redis"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": _bench.REDIS_URL,
    }
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE}")
    requests, expected = inprocess.make_requester()
    result: dict[str, Any] = {"sizes": [], "body_bytes": len(BODY_1KB)}
    loaded = 0
    for size in sizes:
        seconds = bulk_load(loaded, size)
        loaded = size
        connection.close()  # fresh statistics and plans
        samples = inprocess.measure(requests, expected, ("bare", "first", "replay"), args.n, 20)
        point = {
            "size": size,
            "load_seconds": seconds,
            "latency": {name: _bench.summarize(values) for name, values in samples.items()},
            "table": table_bytes(),
            # Pages each statement touched: the B-tree's depth, not the table's size.
            "buffers": {
                label: next((line.strip() for line in plan.splitlines() if "Buffers:" in line), "")
                for label, plan in explain(requests).items()
            },
        }
        result["sizes"].append(point)
        print(
            f"  growth {size:>9,} rows (loaded in {seconds:5.1f} s): "
            + ", ".join(
                f"{name} {stats['median_ms']:.2f} ms" for name, stats in point["latency"].items()
            ),
            flush=True,
        )
    result["explain"] = explain(requests)
    result["redis_memory"] = redis_bytes_per_record()
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
