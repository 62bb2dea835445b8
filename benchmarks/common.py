"""What every benchmark shares: configurations, Django in a child process, servers, load, verdicts.

The modules of this folder run as scripts (``python benchmarks/inprocess.py``)
and import each other as top-level modules. A measured process gets its
configuration from the environment (:func:`child_env`), so one run can
measure two checkouts of the library side by side (``--code``).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent

PG_DB = os.environ.get("BENCH_PG_DB", "bench_idempotency")
PG_URL = f"postgres://postgres@127.0.0.1:5432/{PG_DB}"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
REDIS_BEFORE_URL = REDIS_URL.rsplit("/", 1)[0] + f"/{int(REDIS_URL.rsplit('/', 1)[1]) + 1}"
SQLITE_PATH = Path(os.environ.get("BENCH_SQLITE", "/tmp/bench_idempotency.sqlite3"))
PORT = int(os.environ.get("BENCH_PORT", "8765"))

USERNAME, PASSWORD = "bench", "bench-password"
AUTHORIZATION = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
BODY = json.dumps({"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"})
PROTECTED_PATH, BARE_PATH, PEER_PATH = "/api/bookings/", "/bare/bookings/", "/peer/bookings/"

#: Each configuration measured: the example settings' environment.
STORES: dict[str, dict[str, str]] = {
    "sqlite": {"DATABASE_URL": f"sqlite:///{SQLITE_PATH}", "EXAMPLE_IDEMPOTENCY_BACKEND": "db"},
    "postgres": {"DATABASE_URL": PG_URL, "EXAMPLE_IDEMPOTENCY_BACKEND": "db"},
    "redis": {
        "DATABASE_URL": PG_URL,
        "REDIS_URL": REDIS_URL,
        "EXAMPLE_IDEMPOTENCY_BACKEND": "redis",
    },
    # The library's own Python: a store in this process's memory, and no I/O at all
    # (the app's tables in an in-memory SQLite database).
    "memory": {
        "DATABASE_URL": "sqlite://:memory:",
        "EXAMPLE_IDEMPOTENCY_BACKEND": "db",
        "BENCH_MEMORY": "1",
    },
    "memory_quiet": {
        "DATABASE_URL": "sqlite://:memory:",
        "EXAMPLE_IDEMPOTENCY_BACKEND": "db",
        "BENCH_MEMORY": "1",
        "BENCH_LOG_LEVEL": "WARNING",
    },
}
STORE_LABELS = {
    "sqlite": "database store, SQLite",
    "postgres": "database store, PostgreSQL",
    "redis": "Redis store (PostgreSQL for the app)",
    "memory": "in-memory store (the library's own Python)",
    "memory_quiet": "the same, its INFO log records not enabled",
}


def child_env(store: str, code: Path = ROOT, **extra: str) -> dict[str, str]:
    """The environment of a measured process (or gunicorn) for ``store``, running ``code``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("BENCH_", "EXAMPLE_")) and key not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(STORES[store])
    if code != ROOT:  # another checkout: databases of its own (its migrations differ)
        env = {name: value.replace(PG_DB, f"{PG_DB}_before") for name, value in env.items()}
        env["DATABASE_URL"] = env["DATABASE_URL"].replace(str(SQLITE_PATH), f"{SQLITE_PATH}-before")
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


def reset_databases() -> None:
    """Recreate the benchmark's own PostgreSQL databases, SQLite files and Redis databases."""
    import psycopg
    import redis

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as conn:
        for name in (PG_DB, f"{PG_DB}_before"):
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{SQLITE_PATH}{suffix}").unlink(missing_ok=True)
        Path(f"{SQLITE_PATH}-before{suffix}").unlink(missing_ok=True)
    for url in (REDIS_URL, REDIS_BEFORE_URL):
        redis.Redis.from_url(url).flushdb()


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


def run_child(script: str, store: str, *arguments: str, code: Path = ROOT, python: str = "") -> Any:
    """Run ``script`` in a fresh process for ``store``; it prints one JSON line last."""
    command = [python or sys.executable, str(BENCH_DIR / script), "--child", *arguments]
    done = subprocess.run(command, env=child_env(store, code), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{script} {store} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def verdict(label: str, passed: bool, detail: str) -> bool:
    """Print one target's line: ``PASS`` or ``FAIL``, then what was measured."""
    print(f"{'PASS' if passed else 'FAIL'}  {label}: {detail}", flush=True)
    return passed


# -- over HTTP --------------------------------------------------------------------


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


@contextmanager
def gunicorn(
    env: dict[str, str], port: int = PORT, workers: int = 2, python: str = ""
) -> Iterator[str]:
    """A gunicorn serving the benchmark project on 127.0.0.1:``port``; yields its base URL."""
    executable = Path(python or sys.executable).with_name("gunicorn")
    application = "django.core.wsgi:get_wsgi_application()"
    command = [str(executable), application, f"--workers={workers}", f"--bind=127.0.0.1:{port}"]
    command += ["--backlog=512", "--log-level=warning"]
    log = Path(f"/tmp/bench-gunicorn-{port}.log")
    with log.open("wb") as stream:
        process = subprocess.Popen(command, env=env, stdout=stream, stderr=stream)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"gunicorn did not start; see {log}")
            try:
                urllib.request.urlopen(f"{base}/ready/", timeout=2).read()
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def post(url: str, key: str | None, headers: dict[str, str]) -> tuple[int, bool]:
    """One POST of the booking body; its status and whether it was a replay."""
    sent = {"Content-Type": "application/json", "X-Location-Id": "portland", **headers}
    if key is not None:
        sent["Idempotency-Key"] = key
    request = urllib.request.Request(url, data=BODY.encode(), headers=sent, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, bool(response.headers.get("Idempotency-Replayed"))
    except urllib.error.HTTPError as error:
        return error.code, False


def wrk(
    url: str,
    mode: str,
    connections: int,
    seconds: float,
    headers: dict[str, str],
    keys: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Load ``url`` with ``wrk`` (``mode``: bare, first or replay of ``keys``); requests/s."""
    env = {
        **os.environ,
        "BENCH_MODE": mode,
        "BENCH_KEYS": ",".join(keys),
        "BENCH_PREFIX": uuid.uuid4().hex[:8],
        "BENCH_HEADERS": "\n".join(f"{name}: {value}" for name, value in headers.items()),
    }
    command = ["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{round(seconds)}s"]
    command += ["--latency", "-s", str(BENCH_DIR / "wrk_post.lua"), url]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    line = next(row for row in done.stdout.splitlines() if row.startswith("BENCH_JSON "))
    result: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def prepare(env: dict[str, str], python: str = "") -> None:
    """Migrate and create the user, in a process configured by ``env``."""
    subprocess.run([python or sys.executable, __file__], env=env, check=True)


def session_headers(base: str) -> dict[str, str]:
    """Log in through ``/bench-login/``: the cookie and CSRF headers of that session."""
    with urllib.request.urlopen(f"{base}/bench-login/", timeout=10) as response:
        token = response.read().decode()
        cookies = [value.split(";", 1)[0] for value in response.headers.get_all("Set-Cookie")]
    return {"Cookie": "; ".join(cookies), "X-CSRFToken": token, "Referer": base + "/"}


if __name__ == "__main__":
    setup_django()
