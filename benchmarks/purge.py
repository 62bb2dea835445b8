"""What does purging many expired rows do to the writes going on meanwhile?

    python benchmarks/purge.py --database postgres --rows 100000 [--batch-size N] [--pause S]

Inserts --rows expired rows (90 % completed, 10 % abandoned) and --rows / 10 live ones,
prints the plan of the purge's batch selects, then a writer claims and completes fresh
keys, alone (the baseline), then while purge() deletes every expired row. docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import common

sys.path.insert(0, str(common.ROOT))  # this checkout's library; the app alone, no project


def configure(args: argparse.Namespace) -> None:
    """An empty database of the benchmarks' own, with the app's tables."""
    import dj_database_url
    import django
    from django.conf import settings
    from django.core.management import call_command

    if args.database == "postgres":
        common.recreate_postgres(common.PG_DB)
    else:
        common.remove_sqlite(common.SQLITE_PATH)
    database = dj_database_url.parse(common.STORES[args.database]["DATABASE_URL"])
    if args.sqlite_wal:
        database["OPTIONS"] = {"init_command": "PRAGMA journal_mode=WAL;"}
    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        SECRET_KEY="benchmark",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["idempotency_django"],
        DATABASES={"default": database},
        IDEMPOTENCY={"STORE": "database"},
        LOGGING_CONFIG=None,
    )
    django.setup()
    call_command("migrate", "idempotency_django", verbosity=0)


def insert(count: int, expired: bool) -> None:
    """``count`` rows, one executemany per 20,000; expired: one in ten an abandoned claim."""
    from django.db import connection, transaction
    from django.utils import timezone

    from idempotency_django.models import IdempotencyRecord as Record
    from idempotency_django.stores.digests import record_digest

    now = timezone.now()
    fields = [field for field in Record._meta.concrete_fields if not field.primary_key]
    names = [field.name for field in fields]
    key_at, digest_at, expires_at = map(names.index, ("key", "digest", "expires_at"))
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    values = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO {Record._meta.db_table} ({columns}) VALUES ({values})"

    def template(done: bool) -> list[Any]:
        created = now - (timedelta(days=2) if expired else timedelta(minutes=5))
        record = Record(
            principal="bench",
            fingerprint=hashlib.sha256(b"bench").hexdigest(),
            method="POST",
            path="/bench/bookings/",
            request_id="req-bench",
            state=Record.State.IN_PROGRESS,
            token=uuid.uuid4().hex,
            created_at=created,
            expires_at=now + timedelta(days=-1 if expired else 1),
        )
        if done:  # completed, with a stored response
            record.state, record.status_code, record.completed_at = (
                Record.State.COMPLETED,
                201,
                created,
            )
            record.response_headers = [["Content-Type", "application/json"]]
            record.response_body = b'{"id": 1, "status": "booked", "nights": 3}'
        return [
            field.get_db_prep_save(field.pre_save(record, True), connection) for field in fields
        ]

    completed, abandoned = template(True), template(False)
    prefix = "exp" if expired else "live"
    for start in range(0, count, 20_000):
        rows = []
        for n in range(start, min(start + 20_000, count)):
            row = list(abandoned if expired and n % 10 == 9 else completed)
            row[key_at] = f"{prefix}-{n}"
            row[digest_at] = record_digest("bench", "", f"{prefix}-{n}")
            if expired:  # expiry times spread, so that the index order means something
                expires = now - timedelta(days=1, seconds=n % 86400)
                row[expires_at] = connection.ops.adapt_datetimefield_value(expires)
            rows.append(row)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.executemany(sql, rows)


class Writer(threading.Thread):
    """Claims and completes fresh keys at ``rate`` a second, while in a ``with`` block."""

    def __init__(self, rate: float, label: str) -> None:
        super().__init__(daemon=True)
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.label = label
        self.latencies: list[float] = []  # each write's (claim + complete), in seconds
        self.errors: list[str] = []
        self.stop = threading.Event()

    def __enter__(self) -> Writer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join()

    def run(self) -> None:
        from django.db import connections

        from idempotency_django.stores import RecordKey, RequestInfo, StoredResponse
        from idempotency_django.stores.database import DatabaseStore

        store = DatabaseStore()
        info = RequestInfo(method="POST", path="/bench/bookings/", fingerprint="f" * 64)
        response = StoredResponse(201, (("Content-Type", "application/json"),), b'{"ok": true}')
        next_at = time.perf_counter()
        while not self.stop.is_set():
            key = RecordKey("bench-writer", "", f"{self.label}-{uuid.uuid4()}")
            start = time.perf_counter()
            try:
                claim = store.claim(key, info, 300)
                store.complete(key, claim.token, response, 86400)
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            finally:
                self.latencies.append(time.perf_counter() - start)
            next_at += self.interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.perf_counter()
        connections.close_all()


def percentile(values: list[float], fraction: float) -> float:
    """The value at ``fraction`` of the sorted values (1.0: the largest)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def print_plans(batch_size: int) -> None:
    """The query plan of each of the purge's batch selects (they should use the index)."""
    from django.db import connection
    from django.utils import timezone

    from idempotency_django.models import IdempotencyRecord
    from idempotency_django.purge import KINDS

    print("\nquery plan of a purge batch select:")
    now, options = timezone.now(), {"analyze": True} if connection.vendor == "postgresql" else {}
    for kind in KINDS:
        rows = IdempotencyRecord._base_manager.filter(kind.filter(now, None))
        select = rows.order_by("expires_at").values_list("pk", flat=True)[:batch_size]
        print(f"-- {kind.label}: {select.query}")
        print("\n".join(f"   {line}" for line in select.explain(**options).splitlines()))


def measure(args: argparse.Namespace) -> int:
    configure(args)
    from django.db import connection

    from idempotency_django.models import IdempotencyRecord
    from idempotency_django.purge import purge

    live, started = args.rows // 10, time.perf_counter()
    insert(args.rows, expired=True)
    insert(live, expired=False)
    took = time.perf_counter() - started
    print(f"database: {connection.vendor} ({connection.settings_dict['NAME']})")
    print(f"inserted {args.rows:,} expired + {live:,} live rows in {took:.1f}s")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {IdempotencyRecord._meta.db_table}")
    print_plans(args.batch_size)

    with Writer(args.writer_rate, "baseline") as baseline:
        time.sleep(args.baseline_seconds)
    with Writer(args.writer_rate, "during") as during:
        time.sleep(0.5)
        started = time.perf_counter()
        counts = purge(batch_size=args.batch_size, pause=args.pause)
        elapsed = time.perf_counter() - started
    deleted = sum(counts.values())
    survivors = IdempotencyRecord._base_manager.filter(principal="bench").count()
    print(f"\npurge, batch size {args.batch_size}, pause {args.pause}s: {counts}")
    print(f"{deleted:,} rows in {elapsed:.2f}s = {deleted / elapsed:,.0f} rows/s")
    print(f"live rows left: {survivors:,} (expected {live:,})\n")

    rows: list[list[object]] = [["writes", len(baseline.latencies), len(during.latencies), ""]]
    for name, fraction in (("p50", 0.50), ("p99", 0.99), ("max", 1.0)):
        alone, loaded = (
            percentile(writer.latencies, fraction) * 1000 for writer in (baseline, during)
        )
        rows.append([name, f"{alone:.2f} ms", f"{loaded:.2f} ms", f"x{loaded / alone:.2f}"])
    header = [f"writer, {args.writer_rate:g} writes/s", "baseline", "during the purge", "ratio"]
    common.table(header, rows)
    for writer in (baseline, during):
        if writer.errors:
            print(f"{writer.label} writer errors: {len(writer.errors)}, e.g. {writer.errors[0]}")
    ok = survivors == live and deleted == args.rows and not (baseline.errors or during.errors)
    print("\nOK" if ok else "\nMISMATCH (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = common.parser(__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="expired rows to insert")
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--sqlite-wal", action="store_true", help="SQLite in WAL mode")
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--pause", type=float, default=0.0, help="purge pause between batches")
    parser.add_argument("--writer-rate", type=float, default=200.0, help="writes/s (0: flat out)")
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    sys.exit(measure(parser.parse_args()))
