"""Benchmark the purge while a writer keeps claiming and completing keys.

    python benchmarks/purge.py [--rows N] [--database sqlite|postgres]

1. Creates (or empties) a benchmark database and bulk-inserts ``--rows``
   expired rows (90 % expired completed records, 10 % abandoned reservations)
   plus ``--live`` live records that must survive.
2. Baseline: a writer thread claims and completes fresh keys through the
   ``DatabaseStore`` API at ``--writer-rate`` per second for
   ``--baseline-seconds``, recording each write's latency (claim + complete).
3. Purge: the same writer runs while ``purge()`` deletes everything expired,
   in batches of ``--batch-size``.
4. Prints the purge's rows/s, the writer's p50/p99/max latency during the
   purge against the baseline (and the ratio), and the query plan of the
   purge's batch select (on PostgreSQL it should use ``idempotency_record_expires``).

Configures Django itself; run it from the repository root (or anywhere, the
repository is put on ``sys.path``). PostgreSQL: ``PGHOST``/``PGPORT``/``PGUSER``
(default 127.0.0.1:5432, postgres); the database ``idempotency_bench`` is
created when missing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
from django.conf import settings

BENCH_DB = "idempotency_bench"


def configure(database: str, sqlite_path: str, wal: bool) -> None:
    if database == "postgres":
        db: dict[str, Any] = {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "NAME": BENCH_DB,
        }
    else:
        db = {"ENGINE": "django.db.backends.sqlite3", "NAME": sqlite_path}
        if wal:
            db["OPTIONS"] = {"init_command": "PRAGMA journal_mode=WAL;"}
    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        SECRET_KEY="benchmark",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["idempotency_django"],
        DATABASES={"default": db},
        IDEMPOTENCY={"STORE": "database"},
        LOGGING_CONFIG=None,
    )
    django.setup()


def create_postgres_database() -> None:
    import psycopg

    conninfo = {
        "host": os.environ.get("PGHOST", "127.0.0.1"),
        "port": os.environ.get("PGPORT", "5432"),
        "user": os.environ.get("PGUSER", "postgres"),
        "dbname": "postgres",
    }
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{BENCH_DB}"')


def bulk_insert(total: int, *, expired: bool, chunk: int = 20_000) -> None:
    """Insert ``total`` rows fast: one executemany per chunk, values built from the model."""
    from django.db import connection, transaction
    from django.utils import timezone

    from idempotency_django.keys import record_digest
    from idempotency_django.models import IdempotencyRecord

    now = timezone.now()
    fields = [f for f in IdempotencyRecord._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO {IdempotencyRecord._meta.db_table} ({columns}) VALUES ({placeholders})"

    def template(state: str) -> list[Any]:
        created = now - timedelta(days=2) if expired else now - timedelta(minutes=5)
        record = IdempotencyRecord(
            principal="bench",
            location="",
            key="",
            fingerprint=hashlib.sha256(b"bench").hexdigest(),
            method="POST",
            path="/bench/bookings/",
            request_id="req-bench",
            state=state,
            token=uuid.uuid4().hex,
            status_code=201 if state == IdempotencyRecord.State.COMPLETED else None,
            response_headers=[["Content-Type", "application/json"]]
            if state == IdempotencyRecord.State.COMPLETED
            else [],
            response_body=b'{"id": 1, "status": "booked", "nights": 3}'
            if state == IdempotencyRecord.State.COMPLETED
            else b"",
            created_at=created,
            completed_at=created if state == IdempotencyRecord.State.COMPLETED else None,
            expires_at=now - timedelta(days=1) if expired else now + timedelta(days=1),
        )
        return [f.get_db_prep_save(f.pre_save(record, True), connection) for f in fields]

    key_index = [f.name for f in fields].index("key")
    digest_index = [f.name for f in fields].index("digest")
    expires_index = [f.name for f in fields].index("expires_at")
    completed = template(IdempotencyRecord.State.COMPLETED)
    abandoned = template(IdempotencyRecord.State.IN_PROGRESS)
    prefix = "exp" if expired else "live"
    done = 0
    while done < total:
        rows = []
        for n in range(done, min(done + chunk, total)):
            row = list(abandoned if expired and n % 10 == 9 else completed)
            row[key_index] = f"{prefix}-{n}"
            row[digest_index] = record_digest("bench", "", f"{prefix}-{n}")
            if expired:
                # Spread the expiry times so the index order means something.
                row[expires_index] = connection.ops.adapt_datetimefield_value(
                    now - timedelta(days=1, seconds=n % 86400)
                )
            rows.append(row)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.executemany(sql, rows)
        done += len(rows)


class Writer(threading.Thread):
    """Claims and completes fresh keys at a steady rate; records each write's latency."""

    def __init__(self, rate: float, label: str) -> None:
        super().__init__(daemon=True)
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.label = label
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from django.db import connections

        from idempotency_django.stores.base import RecordKey, RequestInfo, StoredResponse
        from idempotency_django.stores.database import DatabaseStore

        store = DatabaseStore()
        info = RequestInfo(method="POST", path="/bench/bookings/", fingerprint="f" * 64)
        response = StoredResponse(201, (("Content-Type", "application/json"),), b'{"ok": true}')
        next_at = time.perf_counter()
        try:
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
        finally:
            connections.close_all()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def summary(latencies: list[float]) -> dict[str, float]:
    return {
        "n": len(latencies),
        "p50": percentile(latencies, 0.50) * 1000,
        "p99": percentile(latencies, 0.99) * 1000,
        "max": max(latencies) * 1000 if latencies else float("nan"),
        "mean": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="expired rows to insert")
    parser.add_argument("--live", type=int, default=None, help="live rows (default rows/10)")
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--sqlite-path", default="/tmp/idempotency-bench.sqlite3")
    parser.add_argument("--sqlite-wal", action="store_true", help="SQLite in WAL mode")
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--pause", type=float, default=0.0, help="purge pause between batches")
    parser.add_argument("--writer-rate", type=float, default=200.0, help="writes/s (0: flat out)")
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    args = parser.parse_args()
    live = args.rows // 10 if args.live is None else args.live

    if args.database == "postgres":
        create_postgres_database()
    configure(args.database, args.sqlite_path, args.sqlite_wal)

    from django.core.management import call_command
    from django.db import connection

    from idempotency_django.models import IdempotencyRecord
    from idempotency_django.purge import KINDS, purge

    call_command("migrate", "idempotency_django", verbosity=0)
    IdempotencyRecord._base_manager.all()._raw_delete(connection.alias)
    print(f"database: {connection.vendor} ({connection.settings_dict['NAME']})")

    started = time.perf_counter()
    bulk_insert(args.rows, expired=True)
    bulk_insert(live, expired=False)
    took = time.perf_counter() - started
    print(f"inserted {args.rows:,} expired + {live:,} live rows in {took:.1f}s")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {IdempotencyRecord._meta.db_table}")

    from django.utils import timezone

    now = timezone.now()
    print("\nquery plan of a purge batch select:")
    for kind in KINDS:
        rows = IdempotencyRecord._base_manager.filter(kind.filter(now, None))
        select = rows.order_by(kind.order_by).values_list("pk", flat=True)[: args.batch_size]
        print(f"-- {kind.label}: {select.query}")
        options = {"analyze": True} if connection.vendor == "postgresql" else {}
        for line in select.explain(**options).splitlines():
            print(f"   {line}")

    baseline = Writer(args.writer_rate, "baseline")
    baseline.start()
    time.sleep(args.baseline_seconds)
    baseline.stop.set()
    baseline.join()

    during = Writer(args.writer_rate, "during")
    during.start()
    time.sleep(0.5)
    started = time.perf_counter()
    counts = purge(batch_size=args.batch_size, pause=args.pause)
    elapsed = time.perf_counter() - started
    during.stop.set()
    during.join()

    deleted = sum(counts.values())
    survivors = IdempotencyRecord._base_manager.filter(principal="bench").count()
    print(f"\npurge: {counts} in {elapsed:.2f}s = {deleted / elapsed:,.0f} rows/s")
    print(f"batch size {args.batch_size}, pause {args.pause}s")
    print(f"live rows left: {survivors:,} (expected {live:,})")
    base, load = summary(baseline.latencies), summary(during.latencies)
    print(f"\nwriter at {args.writer_rate:g} writes/s (claim + complete), milliseconds:")
    print(f"{'':>10} {'n':>7} {'p50':>8} {'p99':>8} {'max':>8} {'mean':>8}")
    for name, s in (("baseline", base), ("purge", load)):
        print(
            f"{name:>10} {s['n']:>7.0f} {s['p50']:>8.2f} {s['p99']:>8.2f} "
            f"{s['max']:>8.2f} {s['mean']:>8.2f}"
        )
    ratios = " ".join(f"{load[m] / base[m]:>7.2f}x" for m in ("p50", "p99", "max", "mean"))
    print(f"{'ratio':>10} {'':>7} {ratios}")
    for writer in (baseline, during):
        if writer.errors:
            print(f"{writer.label} writer errors: {len(writer.errors)}, e.g. {writer.errors[0]}")
    ok = survivors == live and deleted == args.rows and not (baseline.errors or during.errors)
    print("\nOK" if ok else "\nMISMATCH (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
