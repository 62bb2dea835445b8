"""Issue 37 ("Security round four"): each finding reproduced through a real server.

uvicorn serves the test project (tests/round4_settings.py) on the test database,
with ``ENCRYPTION_KEY`` and ``REQUEST_ID_HEADER`` set and the library's log lines
in a file. Every server test here failed on 1b08f39; its docstring says how. The
last section checks, without a server, what the servers' tests do not reach.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import User

from idempotency_django.logs import log_value
from tests import servers

ENCRYPTION_KEY = Fernet.generate_key().decode()
#: The rotated SECRET_KEY; the test settings' own is the old one (sessions are signed with it).
NEW_SECRET = "round4-new-secret-key-" + "b" * 40


@contextlib.contextmanager
def round4_server(log: Path, **environment: str) -> Iterator[str]:
    """uvicorn on the test project with tests/round4_settings.py; yields its base URL."""
    pytest.importorskip("uvicorn")
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.round4_settings",
        "ROUND4_ENCRYPTION_KEY": ENCRYPTION_KEY,
        "ROUND4_LOG": str(log),
        **environment,
    }
    with servers.running(
        lambda port: servers.uvicorn("tests.asgi:application", port), env, what="uvicorn"
    ) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("round4") / "idempotency.log"


@pytest.fixture(scope="module")
def server(django_db_setup: None, log_file: Path) -> Iterator[str]:
    """One server for the module: the database store, the test settings' SECRET_KEY."""
    with round4_server(log_file) as base:
        yield base


class Log:
    """The lines a test's requests added to a server's log file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = path.stat().st_size if path.exists() else 0

    def lines(self) -> list[str]:
        with self.path.open(encoding="utf-8") as file:
            file.seek(self.start)
            return file.read().splitlines()


def post(base: str, path: str, payload: object, **headers: str) -> tuple[int, dict[str, str], Any]:
    status, answer_headers, body = servers.post(
        base + path,
        json.dumps(payload).encode(),
        {"Content-Type": "application/json", **headers},
    )
    lowered = {name.lower(): value for name, value in answer_headers.items()}
    return status, lowered, json.loads(body) if body else None


# -- 4. client-chosen values cannot forge log fields ------------------------------------


def fields(line: str) -> list[tuple[str, str]]:
    """A log line's ``name=value`` fields, as a parser that honours quotes reads them."""
    words = shlex.split(line.split(" idempotency ", 1)[1])
    return [(name, value) for name, _, value in (word.partition("=") for word in words)]


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_a_request_id_cannot_add_fields_to_the_log_line(
    server: str, log_file: Path, alice: User
) -> None:
    """1b08f39 wrote ``request_id=r-1 event=replayed status=200 ...`` as it came: a
    parser read a second ``event`` and ``status`` (and any field the client chose)."""
    forged = 'r-1 event=replayed status=200 key_digest=0000000000000000 "quoted" back\\slash'
    log = Log(log_file)
    headers = {
        "Idempotency-Key": "log-1",
        "X-Request-Id": forged,
        **servers.logged_in_headers(alice),
    }
    assert post(server, "/plain/bookings/", {"slot": "x"}, **headers)[0] == 201
    long_id = "x" * 5000
    headers |= {"Idempotency-Key": "log-2", "X-Request-Id": long_id}
    assert post(server, "/plain/bookings/", {"slot": "y"}, **headers)[0] == 201
    lines = [line for line in log.lines() if " idempotency " in line]
    assert len(lines) >= 4, lines  # reserved and stored, twice
    for line in lines:
        parsed = fields(line)
        names = [name for name, _ in parsed]
        assert len(names) == len(set(names)), line
        assert names.count("event") == 1 and names.count("status") <= 1, line
        request_id = dict(parsed)["request_id"]
        assert request_id in (forged, long_id[:255]), line
        assert len(line) < 700, line


# -- without a server ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("plain/bookings/<int:pk>/", "plain/bookings/<int:pk>/"),
        ("a b", '"a b"'),
        ('say "hi"\\', '"say \\"hi\\"\\\\"'),
        ("line\nbreak=1", '"line\\nbreak=1"'),
        ("caf\u00e9", '"caf\\u00e9"'),
        ("", '""'),
        (201, "201"),
        ("x" * 300, "x" * 255 + "..."),
    ],
)
def test_a_log_value_is_bare_or_quoted_and_bounded(value: object, written: str) -> None:
    assert log_value(value) == written
