"""A pgbouncer of the test's own, in transaction pooling mode, in front of PostgreSQL.

Started from the Debian package's binary on a free port; its pool has few
server connections, so a request that needs a second connection while its
first holds a transaction open waits for one that may never come free.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.redis_helpers import free_port

PGBOUNCER = "/usr/sbin/pgbouncer"
#: The user pgbouncer runs as when the tests run as root (it refuses to run as root).
UNPRIVILEGED_USER = "postgres"
#: Seconds a client waits in pgbouncer's queue for a server connection before
#: pgbouncer gives up on it: bounds a starved request instead of hanging it.
QUERY_WAIT_TIMEOUT = 20


@dataclass(frozen=True)
class Pgbouncer:
    port: int
    database: str
    pool_size: int

    def show(self, what: str) -> list[dict[str, Any]]:
        """A ``SHOW`` command on pgbouncer's admin console, one dict per row."""
        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=UNPRIVILEGED_USER,
            dbname="pgbouncer",
            autocommit=True,
            # The admin console speaks only the simple query protocol.
            cursor_factory=psycopg.ClientCursor,
        ) as connection:
            cursor = connection.execute(f"SHOW {what}")
            names = [column.name for column in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def client_connections(self) -> int:
        """Client connections to the test database (the admin console's own aside)."""
        return sum(1 for client in self.show("CLIENTS") if client["database"] == self.database)


def _config(directory: Path, port: int, database: str, upstream: dict[str, Any], pool: int) -> Path:
    userlist = directory / "userlist.txt"
    users = dict.fromkeys([str(upstream["USER"]), UNPRIVILEGED_USER])
    userlist.write_text("".join(f'"{user}" ""\n' for user in users))
    ini = directory / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"{database} = host={upstream['HOST']} port={upstream['PORT']} dbname={database}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {userlist}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool}\n"
        "reserve_pool_size = 0\n"
        "max_client_conn = 1000\n"
        f"query_wait_timeout = {QUERY_WAIT_TIMEOUT}\n"
        f"admin_users = {UNPRIVILEGED_USER}\n"
    )
    for path in (directory, userlist, ini):
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the unprivileged user
    return ini


@contextlib.contextmanager
def pgbouncer(database: str, upstream: dict[str, Any], pool_size: int = 2) -> Iterator[Pgbouncer]:
    """pgbouncer on a free port, pooling ``database`` of the server ``upstream`` describes.

    ``upstream`` is a Django ``DATABASES`` entry (HOST, PORT, USER).
    """
    if not os.access(PGBOUNCER, os.X_OK):
        pytest.skip(f"{PGBOUNCER} is not installed (Debian package pgbouncer)")
    directory = Path(tempfile.mkdtemp(prefix="idempotency-pgbouncer-"))
    port = free_port()
    ini = _config(directory, port, database, upstream, pool_size)
    command = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:
        command[1:1] = ["-u", UNPRIVILEGED_USER]
    log = (directory / "pgbouncer.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = Pgbouncer(port=port, database=database, pool_size=pool_size)
    try:
        _wait_until_listening(server, process, directory)
        yield server
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


def _wait_until_listening(
    server: Pgbouncer, process: subprocess.Popen[bytes], directory: Path
) -> None:
    deadline = time.monotonic() + 10  # a start-up guard, not a measurement
    while True:
        try:
            server.show("VERSION")
            return
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                log = (directory / "pgbouncer.log").read_text(errors="replace")
                pytest.fail(f"pgbouncer did not start:\n{log}")
            time.sleep(0.05)
