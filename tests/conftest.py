from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.urls import get_resolver

# -- the real-service part of the suite -------------------------------------------
# Plain `pytest` runs the embedded default (SQLite, local memory, the test client,
# and Redis at :6379 when it runs); `pytest -m services` runs the tests below, which
# start real servers, a browser or another project; `pytest --all` runs both (CI).

TESTS = Path(__file__).resolve().parent

#: Every test under these paths starts real servers or processes.
SERVICE_PATHS = (
    "hangup/",  # uvicorn, daphne and gunicorn, clients that hang up
    "ninja_server/",  # gunicorn and uvicorn serving the django-ninja API
    "graphql_server/",  # gunicorn and uvicorn serving the GraphQL mutations
    "reliability/",  # gunicorn, PostgreSQL and Redis of its own (IDEMPOTENCY_RELIABILITY=1)
    "real_stack/test_pgbouncer.py",  # a pgbouncer in front of PostgreSQL
    "test_scale_out.py",  # gunicorn workers, a redis-server cluster, PostgreSQL
    "test_admin_browser.py",  # Chromium
    "test_example_browser.py",  # Chromium against the example project
    "test_example_project.py",  # the example project's runserver, curl
    "test_example_openapi.py",  # the example project's manage.py
    "test_quickstart.py",  # startproject, runserver and curl
    "test_task_workers.py",  # Celery workers, the tasks framework's db_worker
    "test_task_views.py",  # uvicorn running views that run tasks in-process
)
#: Fixtures that start a real server (test_async.py, test_client.py).
SERVICE_FIXTURES = frozenset({"uvicorn_server", "server", "storeless_server"})
#: Tests that run on a database of their own, never the test database: the example
#: project's SQLite file, or a fresh startproject's. The SQLite run covers them; under
#: TEST_DATABASE=postgres or mariadb they would only run again unchanged (CI's time).
OWN_DATABASE_PATHS = (
    "test_example_project.py",
    "test_example_browser.py",
    "test_example_openapi.py",
    "test_quickstart.py::test_the_settings_lines_work_in_a_fresh_project",
    "test_quickstart.py::test_the_quickstart_pasted_into_a_fresh_project",
)
#: Real-server suites of views that sleep (the hang-up matrix: 2-3 minutes a run, the
#: hang-ups at every step, the real workers), run only under the production databases
#: named: CI's time. The SQLite run keeps the example project's and the other servers;
#: TESTS_SERVER_SUITES_ON_SQLITE=1 runs these there too (CI's newest-Django run).
SERVER_DATABASE_PATHS = {
    "test_hangup_matrix.py": frozenset({"postgres"}),
    "hangup/": frozenset({"postgres"}),
    "test_task_workers.py": frozenset({"postgres", "mariadb"}),
}
#: test_client.py's example-project servers.
OWN_DATABASE_FIXTURES = {"test_client.py": frozenset({"server", "storeless_server"})}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all",
        action="store_true",
        help="Run the whole suite: the embedded default and the real-service tests (CI).",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--all"):
        config.option.markexpr = ""  # drops addopts' -m "not services"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    database = getattr(settings, "TEST_DATABASE", "sqlite")
    another_database = database != "sqlite"
    everywhere = database == "sqlite" and os.environ.get("TESTS_SERVER_SUITES_ON_SQLITE") == "1"
    for item in items:
        relative = item.path.resolve().relative_to(TESTS).as_posix()
        fixtures = set(getattr(item, "fixturenames", ()))
        if relative.startswith(SERVICE_PATHS) or SERVICE_FIXTURES & fixtures:
            item.add_marker(pytest.mark.services)
        if another_database and _own_database(relative, item.name, fixtures):
            item.add_marker(pytest.mark.skip(reason="a database of its own: the SQLite run"))
        for path, databases in SERVER_DATABASE_PATHS.items():
            if relative.startswith(path) and database not in databases and not everywhere:
                names = " and ".join(sorted(databases))
                item.add_marker(pytest.mark.skip(reason=f"runs under TEST_DATABASE={names}"))


def _own_database(relative: str, name: str, fixtures: set[str]) -> bool:
    node = f"{relative}::{name.split('[')[0]}"
    return node.startswith(OWN_DATABASE_PATHS) or bool(
        OWN_DATABASE_FIXTURES.get(relative, frozenset()) & fixtures
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.option.markexpr == "not services":
        return (
            "embedded default: real-service tests (servers, browser, example project, "
            "scale-out, reliability) are deselected, too slow to run often: "
            "pytest -m services runs them, pytest --all runs everything"
        )
    return None


@pytest.fixture(scope="session", autouse=True)
def bound_urlconf() -> None:
    """Import the URLconf before any test, as a server does at startup.

    django-ninja reads the key contract into an operation's schema when its API is
    bound (``api.urls``, in the URLconf): imported first under a test's
    ``override_settings``, the schema would keep that test's settings for the run.
    """
    get_resolver().url_patterns  # noqa: B018 (the import is the point)


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user("alice", password="alice-password")


@pytest.fixture
def bob(db: None) -> User:
    return User.objects.create_user("bob", password="bob-password")


@pytest.fixture
def alice_client(alice: User) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_client(bob: User) -> Client:
    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    """``ATOMIC_REQUESTS = True`` on the default database."""
    database = connections.settings["default"]
    database["ATOMIC_REQUESTS"] = True
    try:
        yield
    finally:
        database["ATOMIC_REQUESTS"] = False
