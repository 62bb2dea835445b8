"""Scale-out: two gunicorn servers share one store, and a same-key storm still runs once.

Each server is the example project in a gunicorn of its own, on its own port;
the storm's requests go to the two ports in turn. The shared store is the
database store on PostgreSQL, or the Redis store on a Redis Cluster of three
local nodes (``redis-server`` in cluster mode on spare ports, the store's
client a ``RedisCluster``: ``tests/cluster_client.py``). Skipped without
gunicorn, PostgreSQL, or (for the cluster) ``redis-server``.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests import servers

ROOT = Path(__file__).resolve().parent.parent
GUNICORN = Path(sys.executable).with_name("gunicorn")
PG_NAME = os.environ.get("TESTS_PG_TEST_NAME", "test_idempotency") + "_scale_out"
AUTHORIZATION = "Basic " + base64.b64encode(b"scale:scale-password").decode()
BODY = b'{"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"}'
CLIENTS = 32
DELAY_MS = 400

pytestmark = [
    pytest.mark.skipif(not GUNICORN.exists(), reason="gunicorn is not installed"),
    pytest.mark.skipif(
        os.environ.get("TEST_DATABASE", "sqlite") != "sqlite",
        reason="servers on PostgreSQL of their own whatever TEST_DATABASE: once per CI run",
    ),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def postgres() -> str:
    """A fresh database of this test on the local PostgreSQL: its URL."""
    psycopg = pytest.importorskip("psycopg")
    try:
        with psycopg.connect(
            "host=127.0.0.1 user=postgres dbname=postgres", autocommit=True, connect_timeout=2
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{PG_NAME}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{PG_NAME}"')
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL is not reachable at 127.0.0.1:5432: {exc}")
    return f"postgres://postgres@127.0.0.1:5432/{PG_NAME}"


def cluster_port() -> int:
    """A free port whose cluster bus port (the port + 10000) is free too."""
    while True:
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


@contextlib.contextmanager
def redis_cluster(nodes: int = 3) -> Iterator[str]:
    """A Redis Cluster of ``nodes`` primaries on spare ports; yields one node's URL."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server is not installed")
    ports = [cluster_port() for _ in range(nodes)]
    with tempfile.TemporaryDirectory(prefix="scale-out-cluster-") as directory:
        servers = []
        for port in ports:
            node = Path(directory) / str(port)
            node.mkdir()
            command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1"]
            command += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            command += ["--dir", str(node), "--save", "", "--appendonly", "no"]
            servers.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))
        try:
            for port in ports:
                wait_for(lambda port=port: cli(port, "ping") == "PONG")  # type: ignore[misc]
            create = ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports)]
            create += ["--cluster-replicas", "0", "--cluster-yes"]
            subprocess.run(create, check=True, capture_output=True, timeout=60)
            for port in ports:
                wait_for(lambda port=port: "cluster_state:ok" in cli(port, "cluster", "info"))  # type: ignore[misc]
            yield f"redis://127.0.0.1:{ports[0]}/0"
        finally:
            for server in servers:
                server.terminate()
                server.wait(10)


def cli(port: int, *command: str) -> str:
    """redis-cli's answer; empty while a loaded machine keeps the node from answering."""
    try:
        done = subprocess.run(
            ["redis-cli", "-p", str(port), *command], capture_output=True, text=True, timeout=10
        )
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout.strip()


def wait_for(condition: Callable[[], bool]) -> None:
    servers.wait_until(condition, what="redis-server")


def server_env(database_url: str, cluster: str = "", wait: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EXAMPLE_", "SCALE_OUT_"))}
    env.update(
        DATABASE_URL=database_url,
        DJANGO_SETTINGS_MODULE="tests.scale_out_settings",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "example_project")]),
        EXAMPLE_BOOKING_DELAY_MS=str(DELAY_MS),
        EXAMPLE_DEBUG="0",
        SCALE_OUT_CLUSTER=cluster,
        SCALE_OUT_WAIT=wait,
    )
    env.pop("REDIS_URL", None)
    return env


@contextlib.contextmanager
def two_servers(env: dict[str, str]) -> Iterator[list[str]]:
    """Two gunicorns of the example project sharing ``env``'s store; yields their URLs."""
    setup = (
        "import django; django.setup(); from django.core.management import call_command; "
        "call_command('migrate', verbosity=0); from django.contrib.auth.models import User; "
        "User.objects.create_user('scale', password='scale-password')"
    )
    subprocess.run([sys.executable, "-c", setup], env=env, check=True, timeout=300)
    ports = [free_port(), free_port()]
    processes = [
        subprocess.Popen(
            [str(GUNICORN), "example.wsgi", "--workers=3", f"--bind=127.0.0.1:{port}"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in ports
    ]
    bases = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for base, process in zip(bases, processes, strict=True):
            servers.wait_until(lambda base=base: ready(base), process, what=f"gunicorn at {base}")  # type: ignore[misc]
        yield bases
    finally:
        for process in processes:
            process.terminate()
            process.wait(20)


def ready(base: str) -> bool:
    """A worker answers an authenticated list (migrated, the user created)."""
    return servers.status(f"{base}/api/bookings/", {"Authorization": AUTHORIZATION}) == 200


def post(base: str, key: str | None) -> tuple[int, bool]:
    headers = {"Content-Type": "application/json", "Authorization": AUTHORIZATION}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(f"{base}/api/bookings/", BODY, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Idempotency-Replayed") == "true"
    except urllib.error.HTTPError as error:
        return error.code, False
    except (urllib.error.URLError, ConnectionError):
        return 0, False


def storm(bases: list[str]) -> list[tuple[int, bool]]:
    """``CLIENTS`` requests with one key at once, to the servers in turn, then one more."""
    key = f"storm-{uuid.uuid4().hex}"
    barrier = threading.Barrier(CLIENTS)

    def call(index: int) -> tuple[int, bool]:
        barrier.wait(timeout=30)
        return post(bases[index % len(bases)], key)

    with ThreadPoolExecutor(CLIENTS) as pool:
        replies = list(pool.map(call, range(CLIENTS)))
    return [*replies, post(bases[1], key)]


def bookings(database_url: str) -> int:
    import psycopg

    with psycopg.connect(database_url.replace("postgres://", "postgresql://")) as conn:
        row = conn.execute("SELECT COUNT(*) FROM bookings_booking").fetchone()
    return int(row[0]) if row else 0


def assert_ran_once(replies: list[tuple[int, bool]], database_url: str) -> None:
    """One request ran; the others got 409 in progress or its replay; one booking."""
    assert replies.count((201, False)) == 1, replies
    assert set(replies) <= {(201, False), (201, True), (409, False)}, replies
    assert replies[-1] == (201, True), "a retry after the storm replays"
    assert bookings(database_url) == 1


def test_storm_runs_once_on_two_servers_sharing_postgres() -> None:
    database_url = postgres()
    with two_servers(server_env(database_url)) as bases:
        replies = storm(bases)
    assert_ran_once(replies, database_url)


@pytest.mark.parametrize("wait", ["", "10"], ids=["409", "wait-and-key-limit"])
def test_storm_runs_once_on_two_servers_sharing_a_redis_cluster(wait: str) -> None:
    """With ``wait``: duplicates wait (pub/sub), and keys are counted per principal."""
    database_url = postgres()
    with redis_cluster() as node, two_servers(server_env(database_url, node, wait)) as bases:
        replies = storm(bases)
        entries = sum(int(cli(int(port), "dbsize")) for port in cluster_ports(node))
    assert_ran_once(replies, database_url)
    assert entries >= 1, "the record lives in the cluster"
    if wait:
        assert replies.count((201, True)) == len(replies) - 1, replies


def cluster_ports(node: str) -> list[str]:
    """The ports of every node of the cluster ``node`` belongs to."""
    port = int(node.rsplit(":", 1)[1].split("/")[0])
    nodes = cli(port, "cluster", "nodes").splitlines()
    return [line.split()[1].split("@")[0].rsplit(":", 1)[1] for line in nodes]
