"""Behind pgbouncer in transaction pooling mode, with ``ATOMIC_REQUESTS``.

The project's database is reached through a pgbouncer whose pool has two
server connections, as in production. A request's transaction holds one of them
until it ends, so a request that needed a second connection would wait for a
pool its own kind holds. Requests are served as a WSGI server serves them:
Django closes the connections it must before and after each one.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import close_old_connections, connection, connections
from django.test import Client

from tests.concurrency import Background, default_database, in_threads, logged_in_client
from tests.real_stack.pgbouncer import Pgbouncer, pgbouncer
from tests.real_stack.views import HANG_GUARD
from tests.testapp.models import Booking

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="pgbouncer pools PostgreSQL"),
]

THREADS = 6
REQUESTS_PER_THREAD = 3
URLS = [pytest.param("/plain/bookings/", id="middleware"), pytest.param("/api/bookings/", id="drf")]


@pytest.fixture
def bouncer(transactional_db: None) -> Iterator[Pgbouncer]:
    """pgbouncer in front of the test database pytest-django created."""
    default = connections.settings["default"]
    with pgbouncer(str(default["NAME"]), default, pool_size=2) as server:
        yield server


def project_database(**changes: Any) -> contextlib.AbstractContextManager[None]:
    """The default database with ``changes`` and ``ATOMIC_REQUESTS``, for the connections
    opened from now on (every thread's, and this one's after it is closed here)."""
    return default_database(ATOMIC_REQUESTS=True, **changes)


def through(bouncer: Pgbouncer, conn_max_age: int) -> contextlib.AbstractContextManager[None]:
    return project_database(
        HOST="127.0.0.1",
        PORT=str(bouncer.port),
        CONN_MAX_AGE=conn_max_age,
        # Transaction pooling: no server-side cursors (psycopg 3 prepares nothing by default).
        DISABLE_SERVER_SIDE_CURSORS=True,
    )


def served(client: Client, url: str, key: str) -> int:
    """One keyed POST as a WSGI server serves it, which the test client does not.

    Django's handler runs ``close_old_connections`` when a request starts and
    when it finishes: it closes connections older than ``CONN_MAX_AGE``.
    """
    close_old_connections()
    try:
        response = client.post(
            url, {"slot": key}, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
        )
        return int(response.status_code)
    finally:
        close_old_connections()


def storm(
    clients: list[Client], url: str, after_serving: Callable[[], None] = lambda: None
) -> list[Any]:
    """A thread per client, each sending REQUESTS_PER_THREAD keyed POSTs with keys of its own."""

    def work(thread: int) -> list[int]:
        try:
            return [
                served(clients[thread], url, f"thread-{thread}-request-{number}")
                for number in range(REQUESTS_PER_THREAD)
            ]
        finally:
            after_serving()

    return in_threads(len(clients), work)


ALL_CREATED = [[201] * REQUESTS_PER_THREAD] * THREADS


def logged_in(alice: User) -> list[Client]:
    return [logged_in_client(alice) for _ in range(THREADS)]


@pytest.mark.parametrize("url", URLS)
def test_every_request_runs_once_through_a_pool_of_two(
    alice: User, bouncer: Pgbouncer, url: str
) -> None:
    with through(bouncer, conn_max_age=0):
        assert storm(logged_in(alice), url) == ALL_CREATED
        assert Booking.objects.count() == THREADS * REQUESTS_PER_THREAD


@pytest.mark.parametrize("url", URLS)
def test_every_request_runs_once_with_persistent_connections(
    alice: User, bouncer: Pgbouncer, url: str
) -> None:
    with through(bouncer, conn_max_age=60):
        assert storm(logged_in(alice), url) == ALL_CREATED
        assert Booking.objects.count() == THREADS * REQUESTS_PER_THREAD


def storm_holding_connections(
    alice: User, url: str, count_connections: Callable[[], int]
) -> tuple[Any, int]:
    """Run the storm; count the open connections once every thread has served, before any
    closes its own (as a server's threads keep theirs under ``CONN_MAX_AGE``)."""
    served_all = threading.Barrier(THREADS + 1)
    counted = threading.Event()

    def hold() -> None:
        served_all.wait(HANG_GUARD)
        counted.wait(HANG_GUARD)

    clients = logged_in(alice)
    connections["default"].close()  # the test's own, used for the logins
    running = Background(lambda: storm(clients, url, hold)).start()
    served_all.wait(HANG_GUARD)
    count = count_connections()
    counted.set()
    return running.join(), count


@pytest.mark.parametrize("url", URLS)
def test_one_client_connection_per_server_thread_through_pgbouncer(
    alice: User, bouncer: Pgbouncer, url: str
) -> None:
    with through(bouncer, conn_max_age=60):
        results, client_connections = storm_holding_connections(
            alice, url, bouncer.client_connections
        )
    assert results == ALL_CREATED
    assert client_connections == THREADS


@pytest.mark.parametrize("url", URLS)
def test_one_server_connection_per_server_thread_on_postgresql(alice: User, url: str) -> None:
    name = f"idempotency-{uuid.uuid4().hex[:12]}"

    def server_connections() -> int:
        """The project's connections, this query's own aside."""
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                [name],
            )
            return int(cursor.fetchone()[0])

    with project_database(CONN_MAX_AGE=60, OPTIONS={"application_name": name}):
        results, count = storm_holding_connections(alice, url, server_connections)
    assert results == ALL_CREATED
    assert count == THREADS
