"""Shared helpers of the overhead benchmark: environments, databases, Django setup, stats."""

from __future__ import annotations

import base64
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "benchmarks"
RESULTS_JSON = BENCH_DIR / "results.json"

PG_HOST = os.environ.get("PGHOST", "127.0.0.1")
PG_PORT = os.environ.get("PGPORT", "5432")
PG_USER = os.environ.get("PGUSER", "postgres")
PG_DB = "bench_idempotency"
PG_URL = f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{PG_DB}"
REDIS_URL = "redis://127.0.0.1:6379/14"
SQLITE_PATH = Path("/tmp/bench_idempotency.sqlite3")

USERNAME = "bench"
PASSWORD = "bench-password"
AUTHORIZATION = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
LOCATION = "portland"
BODY = json.dumps({"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"})
OTHER_BODY = json.dumps({"slot": "2026-07-31T09:00:00Z", "customer": "Dana Whitfield"})
PROTECTED_PATH = "/api/bookings/"
BARE_PATH = "/bare/bookings/"

#: The three configurations measured: (name, label, environment of the example settings).
STORES: dict[str, dict[str, str]] = {
    "sqlite": {"DATABASE_URL": f"sqlite:///{SQLITE_PATH}", "EXAMPLE_IDEMPOTENCY_BACKEND": "db"},
    "postgres": {"DATABASE_URL": PG_URL, "EXAMPLE_IDEMPOTENCY_BACKEND": "db"},
    "redis": {
        "DATABASE_URL": PG_URL,
        "REDIS_URL": REDIS_URL,
        "EXAMPLE_IDEMPOTENCY_BACKEND": "redis",
    },
    # Variants of the PostgreSQL run, to explain it (targets use "postgres").
    "postgres_atomic": {
        "DATABASE_URL": PG_URL,
        "EXAMPLE_IDEMPOTENCY_BACKEND": "db",
        "EXAMPLE_ATOMIC_REQUESTS": "1",
    },
    "postgres_async": {
        "DATABASE_URL": PG_URL,
        "EXAMPLE_IDEMPOTENCY_BACKEND": "db",
        "BENCH_PG_SYNC_COMMIT_OFF": "1",
    },
    "postgres_memory": {
        "DATABASE_URL": PG_URL,
        "EXAMPLE_IDEMPOTENCY_BACKEND": "db",
        "BENCH_MEMORY_STORE": "1",
    },
}
STORE_LABELS = {
    "sqlite": "database store, SQLite",
    "postgres": "database store, PostgreSQL",
    "redis": "Redis store (PostgreSQL for the app)",
    "postgres_atomic": "database store, PostgreSQL, ATOMIC_REQUESTS",
    "postgres_async": "database store, PostgreSQL, synchronous_commit=off (diagnostic)",
    "postgres_memory": "in-memory store, the library alone (benchmarks/memory_store.py)",
}


def child_env(store: str, **extra: str) -> dict[str, str]:
    """The environment of a benchmark process (or gunicorn) for ``store``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in {
            "DATABASE_URL",
            "REDIS_URL",
            "EXAMPLE_IDEMPOTENCY_BACKEND",
            "EXAMPLE_ATOMIC_REQUESTS",
            "BENCH_PG_SYNC_COMMIT_OFF",
            "BENCH_MEMORY_STORE",
        }
    }
    env.update(STORES[store])
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.bench_settings"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "example_project")])
    env.setdefault("EXAMPLE_BOOKING_DELAY_MS", "0")
    # Long enough that the pre-created reservation stays "in progress" for the whole run.
    env["EXAMPLE_LOCK_TIMEOUT_S"] = "3600"
    env["PYTHONHASHSEED"] = "0"
    env.update(extra)
    return env


def recreate_postgres() -> None:
    """Drop and create the benchmark database (never the others)."""
    import psycopg

    with psycopg.connect(
        host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{PG_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{PG_DB}"')


def recreate_sqlite() -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{SQLITE_PATH}{suffix}").unlink(missing_ok=True)


def flush_redis() -> None:
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()


def setup_django() -> None:
    """In a child started with :func:`child_env`: configure Django, migrate, add the user."""
    for entry in (str(ROOT), str(ROOT / "example_project")):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.bench_settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    user_model = get_user_model()
    if not user_model.objects.filter(username=USERNAME).exists():
        user_model.objects.create_user(USERNAME, password=PASSWORD)


def summarize(samples_ns: list[int]) -> dict[str, float]:
    """Median, p95 and mean in milliseconds."""
    ordered = sorted(samples_ns)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "median_ms": statistics.median(ordered) / 1e6,
        "p95_ms": p95 / 1e6,
        "mean_ms": statistics.fmean(ordered) / 1e6,
    }


def load_results() -> dict[str, Any]:
    if RESULTS_JSON.exists():
        return dict(json.loads(RESULTS_JSON.read_text()))
    return {}


def save_results(results: dict[str, Any]) -> None:
    RESULTS_JSON.write_text(json.dumps(results, indent=1) + "\n")
