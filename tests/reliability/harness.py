"""Run the example project as a real server and drive it over HTTP.

Everything here talks to 127.0.0.1 only: a fresh database per scenario (a
``reliability_<uuid>`` database on the shared PostgreSQL, a SQLite file, or a
PostgreSQL cluster a test creates itself), a private ``redis-server`` on a free
port, and ``gunicorn`` serving ``example_project``. Results are checked by
querying those databases directly, never through pytest-django's test database.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import http.cookies
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

REPO_ROOT = Path(__file__).resolve().parents[2]
MANAGE = REPO_ROOT / "example_project" / "manage.py"
BIN = Path(sys.executable).parent
GUNICORN = BIN / "gunicorn"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
SHARED_PG: dict[str, Any] = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}
RECORD_TABLE = "idempotency_django_idempotencyrecord"
BOOKING_TABLE = "bookings_booking"
SLOT = "2026-07-30T09:00:00Z"
#: A request body field DRF ignores: it must never be stored or logged anywhere.
BODY_MARKER = "bodymarker-" + uuid.uuid4().hex

#: Values that must never appear in server output or in a database dump.
SECRETS: dict[str, str] = {BODY_MARKER: "request body marker"}
#: Files (server logs, database and Redis dumps) written as each stack stops.
ARTIFACTS: list[tuple[str, Path]] = []
_artifact_dir: list[Path] = []


def artifact_dir() -> Path:
    """This session's directory for server logs and dumps (kept after the run)."""
    if not _artifact_dir:
        _artifact_dir.append(Path(tempfile.mkdtemp(prefix="idempotency-reliability-")))
    return _artifact_dir[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class InfrastructureError(RuntimeError):
    """A server or tool of the test bench failed: the scenario never ran, nothing was judged.

    The only failure CI may retry (``--only-rerun InfrastructureError``). A
    verdict of lost or doubled bookings is an AssertionError, never this.
    """


def wait_until(
    condition: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


# -- HTTP -------------------------------------------------------------------

Header = tuple[str | bytes, str | bytes]


@dataclass
class Reply:
    status: int  # 0: no HTTP response (connection reset, timeout)
    latency_ms: float
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    error: str = ""
    started: float = 0.0

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotency-replayed") == "true"

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def code(self) -> str | None:
        data = self.json()
        return data.get("code") if isinstance(data, dict) else None

    def trace(self) -> str:
        """Its status, code, replay mark, error, start (monotonic) and latency: for a problem."""
        mark = " replayed" if self.replayed else ""
        return (
            f"{self.status}{mark} {self.code or ''} {self.error} "
            f"at {self.started:.3f}s in {self.latency_ms:.0f} ms"
        )

    def short(self) -> str:
        body = self.body[:300].decode("utf-8", "replace")
        return f"{self.status} {self.headers.get('content-type', '')} {self.error} {body!r}"


def send(
    port: int,
    method: str,
    path: str,
    headers: Sequence[Header] = (),
    body: bytes | None = None,
    timeout: float = 30,
) -> Reply:
    """One request on a new connection; raw header names and values are sent as given."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.monotonic()
    start = time.perf_counter()
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        data = response.read()
        return Reply(
            status=response.status,
            latency_ms=(time.perf_counter() - start) * 1000,
            body=data,
            headers={name.lower(): value for name, value in response.getheaders()},
            started=started,
        )
    except (OSError, http.client.HTTPException) as exc:
        return Reply(
            0, (time.perf_counter() - start) * 1000, error=type(exc).__name__, started=started
        )
    finally:
        conn.close()


def parallel(calls: Iterable[Callable[[], Reply]], workers: int) -> list[Reply]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda call: call(), calls))


def percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Credentials:
    username: str
    password: str
    session: str = ""
    csrf: str = ""

    @property
    def basic(self) -> str:
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"

    def auth_headers(self, mode: str = "session") -> list[Header]:
        """``session``: the session cookie and CSRF token (cheap); ``basic``: PBKDF2 per request."""
        if mode == "basic":
            return [("Authorization", self.basic)]
        return [
            ("Cookie", f"sessionid={self.session}; csrftoken={self.csrf}"),
            ("X-CSRFToken", self.csrf),
        ]


def _cookies(reply_headers: list[tuple[str, str]]) -> dict[str, str]:
    jar: dict[str, str] = {}
    for name, value in reply_headers:
        if name.lower() == "set-cookie":
            parsed = http.cookies.SimpleCookie()
            parsed.load(value)
            jar.update({key: morsel.value for key, morsel in parsed.items()})
    return jar


def login(port: int, user: Credentials) -> None:
    """Log in through /admin/login/ once: later requests use the session, not Basic."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/admin/login/")
        response = conn.getresponse()
        response.read()
        csrf = _cookies(response.getheaders())["csrftoken"]
        form = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": csrf,
                "username": user.username,
                "password": user.password,
                "next": "/admin/",
            }
        )
        conn.request(
            "POST",
            "/admin/login/",
            body=form,
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Cookie": f"csrftoken={csrf}",
            },
        )
        response = conn.getresponse()
        response.read()
        cookies = _cookies(response.getheaders())
        assert response.status == 302 and "sessionid" in cookies, "admin login failed"
    finally:
        conn.close()
    user.session = cookies["sessionid"]
    user.csrf = cookies.get("csrftoken", csrf)
    SECRETS[user.session] = f"session cookie of {user.username}"


def booking_body(customer: str, slot: str = SLOT) -> bytes:
    return json.dumps({"slot": slot, "customer": customer, "note": BODY_MARKER}).encode()


def json_headers(
    user: Credentials | None, key: str | None, location: str | None = "L1", mode: str = "session"
) -> list[Header]:
    headers: list[Header] = [("Content-Type", "application/json")]
    if user is not None:
        headers += user.auth_headers(mode)
    if key is not None:
        headers.append(("Idempotency-Key", key))
    if location is not None:
        headers.append(("X-Location-Id", location))
    return headers


# -- databases --------------------------------------------------------------


class Database:
    url: str
    label: str

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def tables(self) -> list[str]:
        raise NotImplementedError

    def create(self) -> None:
        raise NotImplementedError

    def drop(self) -> None:
        raise NotImplementedError

    def bookings_by_customer(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for booking_id, customer in self.query(f"SELECT id, customer FROM {BOOKING_TABLE}"):
            found.setdefault(customer, []).append(booking_id)
        return found

    def user_pk(self, username: str) -> int:
        return int(self.query("SELECT id FROM auth_user WHERE username = %s", (username,))[0][0])

    def dump(self) -> str:
        """Every column of every table as text (bytes decoded), one line per row.

        ``django_session.session_key`` is left out: it is the session cookie by design.
        """
        lines = []
        for table in self.tables():
            rows, columns = self._select_all(table)
            for row in rows:
                values = {
                    column: _as_text(value)
                    for column, value in zip(columns, row, strict=True)
                    if not (table == "django_session" and column == "session_key")
                }
                lines.append(f"{table} {json.dumps(values, ensure_ascii=False)}")
        return "\n".join(lines)

    def _select_all(self, table: str) -> tuple[list[tuple[Any, ...]], list[str]]:
        raise NotImplementedError


def _as_text(value: Any) -> str:
    if isinstance(value, memoryview):
        value = bytes(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace") + " | " + value.decode("latin-1")
    return str(value)


class PgDatabase(Database):
    def __init__(self, host: str = "127.0.0.1", port: int = 5432, user: str = "postgres") -> None:
        self.host, self.port, self.user = host, port, user
        self.name = f"reliability_{uuid.uuid4().hex[:16]}"
        self.url = f"postgres://{user}@{host}:{port}/{self.name}"
        self.label = "PostgreSQL"

    def _connect(self, dbname: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host=self.host, port=self.port, user=self.user, dbname=dbname, autocommit=True
        )

    def connect(self) -> psycopg.Connection[Any]:
        return self._connect(self.name)

    def create(self) -> None:
        with self._connect("postgres") as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        with contextlib.suppress(psycopg.Error), self._connect("postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            return list(conn.execute(sql, params).fetchall())

    def tables(self) -> list[str]:
        rows = self.query(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
        )
        return [row[0] for row in rows]

    def _select_all(self, table: str) -> tuple[list[tuple[Any, ...]], list[str]]:
        with self.connect() as conn:
            cursor = conn.execute(f'SELECT * FROM "{table}"')
            columns = [column.name for column in cursor.description or []]
            return list(cursor.fetchall()), columns


class SqliteDatabase(Database):
    def __init__(self, directory: Path) -> None:
        self.path = directory / f"reliability_{uuid.uuid4().hex[:16]}.sqlite3"
        self.url = f"sqlite:///{self.path}"
        self.label = "SQLite"

    def create(self) -> None:
        pass

    def drop(self) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(str(self.path) + suffix).unlink(missing_ok=True)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            return list(conn.execute(sql.replace("%s", "?"), tuple(params)).fetchall())
        finally:
            conn.close()

    def tables(self) -> list[str]:
        rows = self.query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        return [row[0] for row in rows]

    def _select_all(self, table: str) -> tuple[list[tuple[Any, ...]], list[str]]:
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            cursor = conn.execute(f'SELECT * FROM "{table}"')
            return list(cursor.fetchall()), [column[0] for column in cursor.description]
        finally:
            conn.close()


class PgCluster:
    """A PostgreSQL cluster of our own (initdb + pg_ctl) that a test may stop and start."""

    def __init__(self, **settings: str) -> None:
        #: Server settings of this cluster's own, as ``-c name=value``.
        self.settings = settings
        #: The WAL writer's pid while ``wal_writer_held`` holds it.
        self.held_wal_writer: int | None = None
        self.root = Path(tempfile.mkdtemp(prefix="reliability-pgcluster-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:  # initdb refuses to run as root: the cluster belongs to postgres
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [str(PG_BIN / args[0]), *args[1:]]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise InfrastructureError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=100"
        ) + "".join(f" -c {name}={value}" for name, value in self.settings.items())
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def crash(self) -> None:
        """Stop as a crash would: no checkpoint, WAL still in the server's buffers is lost."""
        if self.held_wal_writer is not None:
            # A held process would delay the immediate stop by 5 s (then SIGKILL);
            # killed, PostgreSQL takes its death for a crash of the server at once.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.held_wal_writer, signal.SIGKILL)
            self.held_wal_writer = None
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    @contextlib.contextmanager
    def wal_writer_held(self) -> Iterator[None]:
        """Hold the WAL writer (SIGSTOP) until the block ends or a crash kills it.

        An asynchronous commit is written by the WAL writer within
        3 x wal_writer_delay, sooner when its WAL crosses a page: a crash then
        loses some of them or none, by timing. Held, the WAL writer writes none,
        so a crash loses every asynchronous commit no synchronous one flushed.
        ``crash`` kills the held process.
        """
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
            ).fetchone()
        if row is None:
            raise InfrastructureError("the cluster has no WAL writer process")
        self.held_wal_writer = int(row[0])
        os.kill(self.held_wal_writer, signal.SIGSTOP)
        try:
            yield
        finally:
            if self.held_wal_writer is not None:
                os.kill(self.held_wal_writer, signal.SIGCONT)
                self.held_wal_writer = None

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.stop()
        with contextlib.suppress(OSError):
            kept = Path(tempfile.mkdtemp(prefix="pgcluster-", dir=artifact_dir())) / "postgres.log"
            shutil.copyfile(self.root / "log", kept)
            ARTIFACTS.append(("own PostgreSQL cluster: server log", kept))
        shutil.rmtree(self.root, ignore_errors=True)


# -- Redis ------------------------------------------------------------------


class RedisServer:
    """A private ``redis-server`` without persistence, on a free port."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = directory / f"redis-{self.port}.log"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    "redis-server",
                    "--port", str(self.port),
                    "--bind", "127.0.0.1",
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", str(self.directory),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            wait_until(self.ping, 10, what="redis-server")
        except TimeoutError as exc:
            raise InfrastructureError(str(exc)) from exc

    def ping(self) -> bool:
        try:
            return bool(self.client().ping())
        except Exception:
            return False

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def dump(self) -> str:
        client = self.client()
        lines = []
        for name in client.scan_iter(count=1000):
            value = client.get(name)
            lines.append(f"{_as_text(name)} {_as_text(value or b'')}")
        return "\n".join(lines)


def redis_key(principal: str, location: str, key: str, prefix: str = "idempotency") -> str:
    """The Redis store's key for a scope and key (see idempotency_django/stores/redis.py)."""
    material = "\x1f".join((principal, location, key)).encode()
    return f"{prefix}:v1:{hashlib.sha256(material).hexdigest()}"


# -- the example project ----------------------------------------------------


def project_env(**extra: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("EXAMPLE_", "DJANGO_", "IDEMPOTENCY_"))
        and name not in {"DATABASE_URL", "REDIS_URL"}
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(MANAGE), *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        raise InfrastructureError(
            f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        )


class Server:
    """``gunicorn --chdir example_project example.wsgi`` on a free port of 127.0.0.1."""

    def __init__(self, env: dict[str, str], log: Path, workers: int = 3, threads: int = 4) -> None:
        self.env, self.log_path, self.workers, self.threads = env, log, workers, threads
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(GUNICORN),
                    "--chdir", "example_project",
                    "example.wsgi",
                    "-b", f"127.0.0.1:{self.port}",
                    "--workers", str(self.workers),
                    "--threads", str(self.threads),
                    "--timeout", "30",
                    "--graceful-timeout", "5",
                ],
                cwd=REPO_ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.wait_ready()

    def ready(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise InfrastructureError("gunicorn exited:\n" + self.output()[-5000:])
        if len(self.worker_pids()) < self.workers:
            return False
        return send(self.port, "GET", "/admin/login/", timeout=5).status == 200

    def wait_ready(self, timeout: float = 60) -> None:
        try:
            wait_until(self.ready, timeout, interval=0.1, what="gunicorn to serve")
        except TimeoutError as exc:
            raise InfrastructureError(str(exc)) from exc

    def worker_pids(self) -> list[int]:
        """The master's children, read from /proc."""
        assert self.process is not None
        master = self.process.pid
        children = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid ...: comm may hold spaces, so split after ")".
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == master and fields[0] != "Z":
                children.append(int(entry.name))
        return children

    def kill_workers(self) -> list[int]:
        pids = self.worker_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                for pid in self.worker_pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.process.kill()
                self.process.wait()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Stack:
    """One scenario's world: a database, maybe a Redis, users and a running server."""

    label: str
    store: str
    db: Database
    server: Server
    users: dict[str, Credentials]
    redis: RedisServer | None = None

    @property
    def port(self) -> int:
        return self.server.port

    def principal(self, username: str) -> str:
        return f"auth.user:{self.db.user_pk(username)}"

    def record_exists(self, username: str, location: str, key: str) -> bool:
        """Whether the store holds an entry (reservation or response) for this scope and key."""
        if self.store == "redis":
            assert self.redis is not None
            name = redis_key(self.principal(username), location, key)
            return bool(self.redis.client().exists(name))
        rows = self.db.query(
            f"SELECT count(*) FROM {RECORD_TABLE} WHERE principal = %s AND location = %s "
            "AND key = %s",
            (self.principal(username), location, key),
        )
        return bool(rows[0][0])

    def records_with_key(self, key: str) -> int:
        """Database store: rows whose key equals ``key``, in any scope."""
        return int(
            self.db.query(f"SELECT count(*) FROM {RECORD_TABLE} WHERE key = %s", (key,))[0][0]
        )


STORES = ("db-postgres", "redis", "db-sqlite")
STORE_LABELS = {
    "db-postgres": "database (PostgreSQL)",
    "redis": "Redis (+ PostgreSQL)",
    "db-sqlite": "database (SQLite)",
}


def make_users(names: Iterable[str]) -> dict[str, Credentials]:
    users = {}
    for name in names:
        password = f"{name}-pw-{uuid.uuid4().hex[:12]}"
        user = Credentials(name, password)
        SECRETS[password] = f"password of {name}"
        SECRETS[user.basic] = f"Authorization header of {name}"
        SECRETS[user.basic.split()[1]] = f"Basic credential of {name}"
        users[name] = user
    return users


@contextlib.contextmanager
def stack(
    label: str,
    store: str,
    *,
    delay_ms: int = 0,
    lock_timeout: int | None = None,
    atomic: bool = False,
    workers: int = 3,
    threads: int = 4,
    users: Sequence[str] = ("alice", "bob"),
    login_users: bool = True,
    db: Database | None = None,
    redis: RedisServer | None = None,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """A fresh database, migrated, with superusers, served by gunicorn; always torn down."""
    directory = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=artifact_dir()))
    own_db = db is None
    if db is None:
        db = SqliteDatabase(directory) if store == "db-sqlite" else PgDatabase(**SHARED_PG)
    own_redis = store == "redis" and redis is None
    if own_redis:
        redis = RedisServer(directory)
    env = project_env(DATABASE_URL=db.url, EXAMPLE_BOOKING_DELAY_MS=str(delay_ms))
    if lock_timeout is not None:
        env["EXAMPLE_LOCK_TIMEOUT_S"] = str(lock_timeout)
    if atomic:
        env["EXAMPLE_ATOMIC_REQUESTS"] = "1"
    if store == "redis":
        assert redis is not None
        env["REDIS_URL"] = redis.url
        env["EXAMPLE_IDEMPOTENCY_BACKEND"] = "redis"
    env.update(extra_env or {})
    credentials = make_users(users)
    server = Server(env, directory / "server.log", workers=workers, threads=threads)
    try:
        if own_db:
            db.create()
        if own_redis:
            assert redis is not None
            redis.start()
        manage(env, "migrate", "--noinput")
        with ThreadPoolExecutor(max_workers=len(credentials)) as pool:
            list(pool.map(lambda user: _createsuperuser(env, user), credentials.values()))
        server.start()
        if login_users:
            for user in credentials.values():
                login(server.port, user)
        yield Stack(label, store, db, server, credentials, redis)
    finally:
        server.stop()
        _archive(label, directory, server, db, redis)
        if own_redis and redis is not None:
            redis.stop()
        if own_db:
            db.drop()


def _createsuperuser(env: dict[str, str], user: Credentials) -> None:
    manage(
        {**env, "DJANGO_SUPERUSER_PASSWORD": user.password},
        *("createsuperuser", "--noinput", "--username", user.username),
        *("--email", f"{user.username}@example.com"),
    )


def _archive(
    label: str, directory: Path, server: Server, db: Database, redis: RedisServer | None
) -> None:
    ARTIFACTS.append((f"{label}: server output", server.log_path))
    if redis is not None and redis.log.exists():
        ARTIFACTS.append((f"{label}: redis-server output", redis.log))
    with contextlib.suppress(Exception):
        dump = directory / "database.txt"
        dump.write_text(db.dump())
        ARTIFACTS.append((f"{label}: database dump", dump))
    if redis is not None and redis.ping():
        with contextlib.suppress(Exception):
            dump = directory / "redis.txt"
            dump.write_text(redis.dump())
            ARTIFACTS.append((f"{label}: Redis dump", dump))


# -- results ----------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    store: str
    requests: int
    expected: int
    found: int
    five_xx: int
    lost: int
    duplicated: int
    p50: float = 0.0
    p99: float = 0.0
    rps: float = 0.0
    note: str = ""


RESULTS: list[Row] = []
_results_lock = threading.Lock()


def record(row: Row) -> None:
    with _results_lock:
        RESULTS.append(row)


def latency(replies: Sequence[Reply]) -> tuple[float, float]:
    values = [reply.latency_ms for reply in replies]
    return percentile(values, 0.5), percentile(values, 0.99)


HEADER = (
    "| Scenario | Store | Requests | Bookings expected | Bookings found | 5xx | Lost "
    "| Duplicated | p50 ms | p99 ms | req/s | Notes |"
)


def markdown_table(rows: Sequence[Row]) -> str:
    lines = [HEADER, "|" + " --- |" * 12]
    for row in rows:
        p50, p99, rps = (f"{value:.0f}" if value else "" for value in (row.p50, row.p99, row.rps))
        lines.append(
            f"| {row.scenario} | {row.store} | {row.requests} | {row.expected} | {row.found} "
            f"| {row.five_xx} | {row.lost} | {row.duplicated} | {p50} | {p99} | {rps} "
            f"| {row.note} |"
        )
    return "\n".join(lines)


# -- driving many keys ------------------------------------------------------

#: Answers after which a client stops retrying a key.
FINAL = frozenset({201})
#: Answers a client retries with the same key (after a pause).
RETRYABLE = frozenset({0, 409, 500, 502, 503, 504})


def post_booking(
    stack_: Stack, user: Credentials, key: str, location: str = "L1", mode: str = "session"
) -> Reply:
    return send(
        stack_.port,
        "POST",
        "/api/bookings/",
        json_headers(user, key, location, mode),
        booking_body(key),
    )


def settle(
    stack_: Stack,
    user: Credentials,
    replies: dict[str, list[Reply]],
    *,
    max_attempts: int = 40,
    pause: float = 0.25,
    budget_s: float = 90,
    workers: int = 8,
) -> list[Reply]:
    """Retry every key without a 201 (first or replayed) until it has one: bounded."""
    deadline = time.monotonic() + budget_s
    extra: list[Reply] = []
    lock = threading.Lock()

    def drive(key: str) -> None:
        for _ in range(max_attempts):
            if time.monotonic() > deadline:
                return
            if any(reply.status in FINAL for reply in replies[key]):
                return
            if replies[key] and replies[key][-1].status not in RETRYABLE:
                return  # a definite refusal (400, 409 reused): retrying would not help
            reply = post_booking(stack_, user, key)
            with lock:
                replies[key].append(reply)
                extra.append(reply)
            if reply.status not in FINAL:
                time.sleep(pause)

    pending = [
        key for key, answers in replies.items() if not any(r.status in FINAL for r in answers)
    ]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(drive, pending))
    return extra


@dataclass
class Verdict:
    keys: int
    found: int = 0
    lost: int = 0
    duplicated: int = 0
    problems: list[str] = field(default_factory=list)


def verify(db: Database, replies: dict[str, list[Reply]], stack: Stack | None = None) -> Verdict:
    """Each key: exactly one booking, the one every 201 for it names; no stray bookings.

    With ``stack`` (the user alice, location L1), a doubled key's problem also
    quotes the server's log records of that key: what each request did.
    """
    bookings = db.bookings_by_customer()
    verdict = Verdict(keys=len(replies))
    for key, answers in replies.items():
        rows = bookings.get(key, [])
        verdict.found += min(len(rows), 1)
        successes = [reply for reply in answers if reply.status == 201]
        fresh = [reply for reply in successes if not reply.replayed]
        if len(rows) > 1 or len(fresh) > 1:
            verdict.duplicated += max(len(rows), len(fresh)) - 1
            verdict.problems.append(
                f"{key}: {len(rows)} bookings, {len(fresh)} first 201s; answers: "
                + "; ".join(reply.trace() for reply in answers)
                + (explain(stack, key) if stack is not None else "")
            )
        if not successes or not rows:
            verdict.lost += 1
            verdict.problems.append(
                f"{key}: {len(rows)} bookings, answers "
                f"{[reply.status for reply in answers]} {answers[-1].short() if answers else ''}"
            )
            continue
        bodies = {reply.body for reply in successes}
        if len(bodies) != 1:
            verdict.problems.append(f"{key}: different 201 bodies {sorted(bodies)[:3]}")
        answered_id = successes[0].json().get("id")
        if answered_id not in rows:
            verdict.problems.append(f"{key}: answered booking {answered_id}, database has {rows}")
    strays = set(bookings) - set(replies)
    if strays:
        verdict.problems.append(f"bookings for keys never sent: {sorted(strays)[:5]}")
    return verdict


def explain(stack: Stack, key: str, username: str = "alice", location: str = "L1") -> str:
    """The server's log records of ``key``'s record (found by its digest), for a problem."""
    from idempotency_django.stores import RecordKey

    digest = RecordKey(stack.principal(username), location, key).digest[:16]
    lines = [line for line in stack.server.output().splitlines() if digest in line]
    return f"; server log of {digest}: " + " | ".join(lines[:12])


def five_xx(replies: Iterable[Reply]) -> int:
    return sum(1 for reply in replies if reply.status >= 500)


def record_verdict(
    scenario: str,
    store_label: str,
    replies: Sequence[Reply],
    verdict: Verdict,
    *,
    timed: Sequence[Reply] | None = None,
    rps: float = 0.0,
    note: str = "",
) -> None:
    """Record a traffic scenario's row: counts from ``verdict``, latency of ``timed``."""
    p50, p99 = latency(replies if timed is None else timed)
    record(
        Row(
            scenario,
            store_label,
            len(replies),
            verdict.keys,
            verdict.found,
            five_xx(replies),
            verdict.lost,
            verdict.duplicated,
            p50,
            p99,
            rps,
            note=note,
        )
    )


def statuses(replies: Iterable[Reply]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reply in replies:
        label = str(reply.status) if reply.status else f"no answer ({reply.error})"
        if reply.code:
            label += f" {reply.code}"
        elif reply.replayed:
            label += " replayed"
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items()))


@dataclass
class Outage:
    stopped_at: float = 0.0  # the service is down from here (stop() returned)
    restart_at: float = 0.0  # start() called here
    back_at: float = 0.0  # start() returned

    def during(self, reply: Reply) -> bool:
        """Sent after the stop and answered before the restart began."""
        return self.stopped_at <= reply.started and (
            reply.started + reply.latency_ms / 1000 <= self.restart_at
        )


def traffic_with_outage(
    stack_: Stack,
    user: Credentials,
    *,
    stop: Callable[[], None],
    start: Callable[[], None],
    prefix: str,
    stop_after: float = 1.5,
    down_for: float = 3.0,
    clients: int = 6,
    max_keys: int = 400,
    max_attempts: int = 100,
    pause: float = 0.1,
) -> tuple[dict[str, list[Reply]], Outage]:
    """Clients book new keys (each retried until 201, bounded) while a service stops and starts.

    New keys are started until ``stop_after + down_for + 2`` seconds; the whole
    run is bounded by ``max_keys`` keys and ``max_attempts`` tries per key.
    """
    replies: dict[str, list[Reply]] = {}
    lock = threading.Lock()
    outage = Outage()
    began = time.monotonic()
    traffic_end = began + stop_after + down_for + 2
    counter = iter(range(max_keys))

    def client() -> None:
        while time.monotonic() < traffic_end:
            with lock:
                index = next(counter, None)
                if index is None:
                    return
                key = f"{prefix}-{index:04d}"
                answers = replies[key] = []
            for _ in range(max_attempts):
                reply = post_booking(stack_, user, key)
                with lock:
                    answers.append(reply)
                if reply.status in FINAL or reply.status not in RETRYABLE:
                    break
                time.sleep(pause)

    def operator() -> None:
        time.sleep(stop_after)
        stop()
        outage.stopped_at = time.monotonic()
        time.sleep(down_for)
        outage.restart_at = time.monotonic()
        start()
        outage.back_at = time.monotonic()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    chaos = threading.Thread(target=operator, daemon=True)
    chaos.start()
    for thread in threads:
        thread.start()
    chaos.join(timeout=120)
    for thread in threads:
        thread.join(timeout=180)
    assert outage.back_at, "the service was not restarted"
    return replies, outage
