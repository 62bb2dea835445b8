"""Issue 37 ("Security round four"): each finding reproduced through a real server.

uvicorn serves the test project (tests/round4_settings.py) on the test database,
with ``ENCRYPTION_KEY`` and ``REQUEST_ID_HEADER`` set and the library's log lines
in a file. Every server test here failed on 1b08f39; its docstring says how. The
last section checks, without a server, what the servers' tests do not reach.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings

from idempotency_django.logs import log_value
from idempotency_django.models import IdempotencyRecord
from tests import servers
from tests.testapp.models import Booking

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


# -- 2. a principal made of a credential is keyed ----------------------------------------


PIN = {"X-Pin": "402917"}


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_a_six_digit_api_keys_principal_cannot_be_reversed(server: str) -> None:
    """1b08f39 stored ``secret:`` + the plain SHA-256 of the key: the admin's view
    permission was enough to find the PIN by hashing the million candidates (0.4 s)."""
    status, _, _ = post(
        server, "/ninja/pin-bookings", {"slot": "s"}, **PIN, **{"Idempotency-Key": "p-1"}
    )
    assert status == 201
    principal = IdempotencyRecord.objects.get().principal
    assert principal.startswith("secret:")
    digest = principal.rsplit(":", 1)[-1]
    guessed = [
        pin
        for pin in (f"{n:06d}".encode() for n in range(10**6))
        if hashlib.sha256(pin).hexdigest() == digest
    ]
    assert guessed == []


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_a_secret_key_rotation_keeps_the_credentials_live_records(
    server: str, tmp_path: Path
) -> None:
    """After SECRET_KEY moves to the fallbacks, the retry still finds its record (a replay)."""
    key = {"Idempotency-Key": "rotated-1"}
    first = post(server, "/ninja/pin-bookings", {"slot": "r"}, **PIN, **key)
    assert first[0] == 201
    with round4_server(
        tmp_path / "rotated.log",
        ROUND4_SECRET_KEY=NEW_SECRET,
        ROUND4_SECRET_KEY_FALLBACKS=settings.SECRET_KEY,
    ) as rotated:
        status, headers, body = post(rotated, "/ninja/pin-bookings", {"slot": "r"}, **PIN, **key)
        assert (status, headers.get("idempotency-replayed")) == (201, "true")
        assert body == first[2]
        # A new key under the new SECRET_KEY is a record of the new principal.
        fresh = post(
            rotated, "/ninja/pin-bookings", {"slot": "n"}, **PIN, **{"Idempotency-Key": "new"}
        )
        assert fresh[0] == 201
    assert Booking.objects.count() == 2
    principals = set(IdempotencyRecord.objects.values_list("principal", flat=True))
    assert len(principals) == 2  # the old key's and the new key's name of one credential


# -- 3. the auth class is part of a string principal ------------------------------------


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_two_auth_classes_returning_the_same_string_are_two_principals(server: str) -> None:
    """1b08f39 replayed the staff's order to the tenant's integration (both "acme")."""
    key = {"Idempotency-Key": "acme-1"}
    staff = post(
        server, "/ninja/acme-bookings", {"slot": "s"}, **key, **{"X-Staff-Key": "staff-key"}
    )
    tenant = post(
        server, "/ninja/acme-bookings", {"slot": "s"}, **key, **{"X-Tenant-Key": "tenant-key"}
    )
    assert staff[0] == 201 and tenant[0] == 201
    assert "idempotency-replayed" not in tenant[1]
    assert tenant[2]["id"] != staff[2]["id"]
    assert Booking.objects.count() == 2
    # Each one's retry is the replay of its own order.
    again = post(
        server, "/ninja/acme-bookings", {"slot": "s"}, **key, **{"X-Staff-Key": "staff-key"}
    )
    assert (again[1].get("idempotency-replayed"), again[2]) == ("true", staff[2])
    assert Booking.objects.count() == 2


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


@pytest.mark.django_db
@override_settings(IDEMPOTENCY={"ANONYMOUS": "session"})
def test_a_guests_principal_is_keyed_and_survives_a_rotation() -> None:
    """The session key is a credential too: 1b08f39 named a guest by its plain SHA-256."""
    guest = Client()
    first = guest.post("/plain/guest/", {"slot": "g"}, HTTP_IDEMPOTENCY_KEY="g-1")
    assert first.status_code == 201
    session_key = guest.cookies[settings.SESSION_COOKIE_NAME].value
    principal = IdempotencyRecord.objects.get().principal
    assert principal != "session:" + hashlib.sha256(session_key.encode()).hexdigest()
    with override_settings(
        SECRET_KEY="rotated-" + "c" * 50, SECRET_KEY_FALLBACKS=[settings.SECRET_KEY]
    ):
        again = guest.post("/plain/guest/", {"slot": "g"}, HTTP_IDEMPOTENCY_KEY="g-1")
        assert again["Idempotency-Replayed"] == "true"
        assert (
            guest.post("/plain/guest/", {"slot": "n"}, HTTP_IDEMPOTENCY_KEY="g-2").status_code
            == 201
        )
    assert Booking.objects.count() == 2
    assert IdempotencyRecord.objects.values("principal").distinct().count() == 2


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
