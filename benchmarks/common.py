"""What every benchmark shares: configurations, measured processes, command lines, output.

The modules run as scripts (``python benchmarks/inprocess.py``) and import each other as
top-level modules. A measured process is configured by its environment (:func:`child_env`),
so that one run can measure two checkouts of the library side by side.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent

PG_DB = os.environ.get("BENCH_PG_DB", "bench_idempotency")
PG_URL = f"postgres://postgres@127.0.0.1:5432/{PG_DB}"
#: MariaDB: a database of the same name on 127.0.0.1:3306 (root, no password).
MARIADB_URL = f"mysql://root@127.0.0.1:3306/{PG_DB}"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
REDIS_BEFORE_URL = REDIS_URL.rsplit("/", 1)[0] + f"/{int(REDIS_URL.rsplit('/', 1)[1]) + 1}"
SQLITE_PATH = Path(os.environ.get("BENCH_SQLITE", "/tmp/bench_idempotency.sqlite3"))
PORT = int(os.environ.get("BENCH_PORT", "8765"))

USERNAME, PASSWORD = "bench", "bench-password"
AUTHORIZATION = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
BODY = json.dumps({"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"})
PROTECTED_PATH, BARE_PATH, PEER_PATH = "/api/bookings/", "/bare/bookings/", "/peer/bookings/"
SCENARIOS = ("bare", "first", "replay")  # the bare view, a new key, a stored key


def _example_env(database_url: str, backend: str = "db", **more: str) -> dict[str, str]:
    return {"DATABASE_URL": database_url, "EXAMPLE_IDEMPOTENCY_BACKEND": backend, **more}


#: Each configuration measured: the example settings' environment, and its label. The
#: in-memory store (STORE="memory") keeps the app's tables in an in-memory SQLite database.
STORES = {
    "sqlite": _example_env(f"sqlite:///{SQLITE_PATH}"),
    "postgres": _example_env(PG_URL),
    "mariadb": _example_env(MARIADB_URL),
    # A database of its own: its keys must not count against "postgres"'s MAX_KEYS_PER_PRINCIPAL.
    "postgres_async_claim": _example_env(
        PG_URL.replace(PG_DB, f"{PG_DB}_async_claim"), EXAMPLE_ASYNC_CLAIM_COMMIT="1"
    ),
    # Django's server_side_binding, with psycopg preparing each statement once it has
    # run --prepare-threshold times: the app's statements and the store's two alike.
    "postgres_prepared": _example_env(PG_URL, BENCH_SERVER_SIDE_BINDING="1"),
    # Every view in a transaction: the claim joins the view's, the completion commits with it.
    "postgres_atomic": _example_env(PG_URL, EXAMPLE_ATOMIC_REQUESTS="1"),
    "redis": _example_env(PG_URL, "redis", REDIS_URL=REDIS_URL),
    "memory": _example_env("sqlite://:memory:", BENCH_MEMORY="1"),
    "memory_quiet": _example_env("sqlite://:memory:", BENCH_MEMORY="1", BENCH_LOG_LEVEL="WARNING"),
}
#: The same with stored responses encrypted (ENCRYPTION_KEY): "<store>_encrypted", on
#: databases of their own, so that neither run's keys count against the other's
#: MAX_KEYS_PER_PRINCIPAL (the benchmark user's first requests come near it).
ENCRYPTED_PG_DB = f"{PG_DB}_encrypted"
ENCRYPTED_SQLITE_PATH = f"{SQLITE_PATH}-encrypted"
REDIS_ENCRYPTED_URL = REDIS_URL.rsplit("/", 1)[0] + f"/{int(REDIS_URL.rsplit('/', 1)[1]) + 2}"


def _encrypted(env: dict[str, str]) -> dict[str, str]:
    moved = {
        name: value.replace(PG_URL, PG_URL.replace(PG_DB, ENCRYPTED_PG_DB))
        .replace(MARIADB_URL, MARIADB_URL.replace(PG_DB, ENCRYPTED_PG_DB))
        .replace(str(SQLITE_PATH), ENCRYPTED_SQLITE_PATH)
        .replace(REDIS_URL, REDIS_ENCRYPTED_URL)
        for name, value in env.items()
    }
    return {**moved, "BENCH_ENCRYPTION": "1"}


STORES.update({f"{name}_encrypted": _encrypted(env) for name, env in list(STORES.items())})
STORE_LABELS = {
    "sqlite": "database store, SQLite",
    "postgres": "database store, PostgreSQL",
    "mariadb": "database store, MariaDB",
    "postgres_async_claim": "the same, async_claim_commit",
    "postgres_prepared": "the same, server_side_binding and prepared statements",
    "postgres_atomic": "the same, ATOMIC_REQUESTS",
    "redis": "Redis store (PostgreSQL for the app)",
    "memory": "in-memory store (the library's own Python)",
    "memory_quiet": "the same, its INFO log records not enabled",
}
STORE_LABELS.update(
    {f"{name}_encrypted": f"{label}, encrypted" for name, label in list(STORE_LABELS.items())}
)


#: Settings of the run that reach every measured process (bench_settings.py reads them).
PASSED_ON = ("BENCH_MAX_KEYS", "BENCH_PREPARE_THRESHOLD")


def child_env(store: str, code: Path = ROOT, **extra: str) -> dict[str, str]:
    """The environment of a measured process (or gunicorn) for ``store``, running ``code``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key in PASSED_ON
        or (not key.startswith(("BENCH_", "EXAMPLE_")) and key not in ("DATABASE_URL", "REDIS_URL"))
    }
    env.update(STORES[store])
    if code != ROOT:  # another checkout: databases of its own (its migrations differ)
        env["DATABASE_URL"] = env["DATABASE_URL"].replace(str(SQLITE_PATH), f"{SQLITE_PATH}-before")
        # The servers' URLs alone: the SQLite path may contain the database's name.
        before = {url: url.replace(PG_DB, f"{PG_DB}_before") for url in (PG_URL, MARIADB_URL)}
        env = {
            name: value.replace(PG_URL, before[PG_URL]).replace(MARIADB_URL, before[MARIADB_URL])
            for name, value in env.items()
        }
        if "REDIS_URL" in env:
            env["REDIS_URL"] = REDIS_BEFORE_URL
    env.update(
        DJANGO_SETTINGS_MODULE="bench_settings",
        PYTHONPATH=os.pathsep.join(map(str, (BENCH_DIR, code, code / "example_project"))),
        EXAMPLE_DEBUG="0",
        # Long enough that a reservation made by a benchmark stays in progress.
        EXAMPLE_LOCK_TIMEOUT_S="3600",
        PYTHONHASHSEED="0",
    )
    env.update(extra)
    return env


def recreate_postgres(*names: str) -> None:
    import psycopg

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')


def recreate_mariadb(*names: str) -> None:
    import MySQLdb

    connection = MySQLdb.connect(host="127.0.0.1", port=3306, user="root")
    try:
        cursor = connection.cursor()
        for name in names:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        connection.close()


def remove_sqlite(path: Path | str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def reset_databases() -> None:
    """Recreate the benchmark's own PostgreSQL databases, SQLite files and Redis databases."""
    import redis

    recreate_postgres(
        PG_DB,
        f"{PG_DB}_before",
        ENCRYPTED_PG_DB,
        f"{PG_DB}_async_claim",
        f"{PG_DB}_before_async_claim",
    )
    recreate_mariadb(PG_DB, f"{PG_DB}_before", ENCRYPTED_PG_DB)
    remove_sqlite(SQLITE_PATH)
    remove_sqlite(f"{SQLITE_PATH}-before")
    remove_sqlite(ENCRYPTED_SQLITE_PATH)
    for url in (REDIS_URL, REDIS_BEFORE_URL, REDIS_ENCRYPTED_URL):
        redis.Redis.from_url(url).flushdb()


# -- a module's command line, and its measured processes ---------------------------


def parser(doc: str) -> argparse.ArgumentParser:
    """A module's options, described by the first paragraph of its docstring."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])


def integers(text: str) -> list[int]:
    """An option's comma-separated integers (``--connections 8,32``)."""
    return [int(item) for item in text.split(",")]


def run(parser: argparse.ArgumentParser, measure: Callable[..., Any], child: Any = None) -> None:
    """Parse the options and ``measure``; with ``--child``, be a measured process instead:
    print what ``child`` measured as JSON (:func:`run_child` reads it). A FAIL line is a
    finding, not a crash: either way the exit status is 0.
    """
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if child:
        parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if child and args.child:
        print(json.dumps(child(args)))
    else:
        measure(args)


def run_child(script: str, store: str, *arguments: str, code: Path = ROOT, python: str = "") -> Any:
    """Run ``script --child`` in a fresh process for ``store``; what it printed as JSON."""
    command = [python or sys.executable, str(BENCH_DIR / script), "--child", *arguments]
    done = subprocess.run(command, env=child_env(store, code), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{script} {store} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def setup_django() -> None:
    """In a measured process: configure Django, migrate, create the user."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    users = get_user_model().objects
    if not users.filter(username=USERNAME).exists():
        users.create_user(USERNAME, password=PASSWORD)


def client_post(client: Any, path: str, key: str | None) -> int:
    """One POST of the booking body by Django's test ``client``: its status."""
    headers = {"X-Location-Id": "portland", **({} if key is None else {"Idempotency-Key": key})}
    return int(client.post(path, BODY, "application/json", headers=headers).status_code)


def scenario_requests() -> dict[str, Callable[[int], int]]:
    """Each of :data:`SCENARIOS` as one POST by a new test client: ``send(index)`` -> status.

    A first request's key is new for each index; a replay's is this process's
    one stored key. Keys carry a random run id: processes may share a database.
    """
    from django.test import Client

    client, run = Client(HTTP_AUTHORIZATION=AUTHORIZATION), uuid.uuid4().hex[:8]
    return {
        "bare": lambda index: client_post(client, BARE_PATH, None),
        "first": lambda index: client_post(client, PROTECTED_PATH, f"first-{run}-{index}"),
        "replay": lambda index: client_post(client, PROTECTED_PATH, f"replay-{run}"),
    }


# -- output -------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(runs: list[dict[str, float]], name: str) -> float:
    """The median over ``runs`` of each one's ``name`` figure divided by its bare view's."""
    return median([run[name] / run["bare"] for run in runs])


def verdict(label: str, passed: bool, detail: str) -> bool:
    """Print one target's line: ``PASS`` or ``FAIL``, then what was measured."""
    print(f"{'PASS' if passed else 'FAIL'}  {label}: {detail}")
    return passed


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a Markdown table (as docs/benchmarks-results.md shows the figures)."""
    for row in (header, ["---"] * len(header), *rows):
        print("| " + " | ".join(map(str, row)) + " |")
