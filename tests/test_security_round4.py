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

from idempotency_django.models import IdempotencyRecord
from idempotency_django.protocol.logs import log_value
from idempotency_django.stores.base import RecordKey, StoredResponse
from idempotency_django.stores.encryption import SEALED_HEADER, ForeignResponse, seal, unseal
from tests import servers
from tests.redis_helpers import REDIS_URL, raw_client, skip_without_redis
from tests.testapp.models import Booking

ENCRYPTION_KEY = Fernet.generate_key().decode()
#: The rotated SECRET_KEY; the test settings' own is the old one (sessions are signed with it).
NEW_SECRET = "round4-new-secret-key-" + "b" * 40


@contextlib.contextmanager
def round4_server(log: Path, **environment: str) -> Iterator[str]:
    """uvicorn on the test project with tests/round4_settings.py; yields its base URL."""
    with servers.test_project_on_uvicorn(
        "tests.round4_settings",
        ROUND4_ENCRYPTION_KEY=ENCRYPTION_KEY,
        ROUND4_LOG=str(log),
        **environment,
    ) as url:
        yield url


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


# -- 1. a sealed answer belongs to its record ------------------------------------------


@pytest.fixture
def mallory(db: None) -> User:
    return User.objects.create_user("mallory", password="mallory-password")


def _copy_the_answer(store: str, source: RecordKey, target: RecordKey) -> None:
    """What a writer of the table (or the Redis keys) does: alice's answer in mallory's record."""
    if store == "redis":
        client = raw_client()
        alices = client.get(f"idempotency:v1:{source.digest}")
        mallorys = client.get(f"idempotency:v1:{target.digest}")
        assert isinstance(alices, bytes) and isinstance(mallorys, bytes)
        # The header line is mallory's (her token and fingerprint): only the sealed body moves.
        head = mallorys.partition(b"\n")[0]
        client.set(
            f"idempotency:v1:{target.digest}",
            head + b"\n" + alices.partition(b"\n")[2],
            keepttl=True,
        )
        client.close()
        return
    alices_row = IdempotencyRecord.objects.get(digest=source.digest)
    updated = IdempotencyRecord.objects.filter(digest=target.digest).update(
        response_headers=alices_row.response_headers, response_body=alices_row.response_body
    )
    assert updated == 1


@pytest.fixture(params=["database", "redis"])
def sealing_server(
    request: pytest.FixtureRequest, server: str, log_file: Path, tmp_path: Path
) -> Iterator[tuple[str, str, Path]]:
    """(the store's name, a server's URL, its log file), for each store."""
    if request.param == "database":
        yield "database", server, log_file
        return
    skip_without_redis()
    client = raw_client()
    client.flushdb()
    log = tmp_path / "redis.log"
    try:
        with round4_server(log, ROUND4_REDIS_URL=REDIS_URL) as base:
            yield "redis", base, log
    finally:
        client.flushdb()
        client.close()


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_an_answer_copied_into_another_record_is_never_replayed(
    sealing_server: tuple[str, str, Path], alice: User, mallory: User
) -> None:
    """1b08f39 replayed alice's decrypted order to mallory: 201, her slot in the body.

    Now the answer is sealed with its record's identity: mallory's retry is 503
    idempotency_unavailable and one ERROR line names her record's key digest.
    """
    store, base, log_path = sealing_server
    as_alice, as_mallory = servers.logged_in_headers(alice), servers.logged_in_headers(mallory)
    key = {"Idempotency-Key": "order-1"}
    secret_slot = {"slot": "alice: 12 Elm Street, card ending 4242"}
    assert post(base, "/plain/bookings/", secret_slot, **key, **as_alice)[0] == 201
    assert post(base, "/plain/bookings/", {"slot": "m"}, **key, **as_mallory)[0] == 201
    alices = RecordKey(f"auth.user:{alice.pk}", "", "order-1")
    mallorys = RecordKey(f"auth.user:{mallory.pk}", "", "order-1")
    _copy_the_answer(store, alices, mallorys)

    log = Log(log_path)
    status, _, body = post(base, "/plain/bookings/", {"slot": "m"}, **key, **as_mallory)
    assert "12 Elm Street" not in json.dumps(body)
    assert (status, body["code"]) == (503, "idempotency_unavailable")
    errors = [line for line in log.lines() if line.startswith("ERROR")]
    assert len(errors) == 1, errors
    assert f"key_digest={mallorys.digest[:16]}" in errors[0]
    assert "error=ForeignResponse" in errors[0]
    # Alice's own retry still replays her answer, and nothing ran again.
    status, headers, body = post(base, "/plain/bookings/", secret_slot, **key, **as_alice)
    assert (status, headers.get("idempotency-replayed")) == (201, "true")
    assert body["slot"] == secret_slot["slot"]
    assert Booking.objects.count() == 2


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


ANSWER = StoredResponse(201, (("Content-Type", "application/json"),), b'{"slot": "alice"}')
ALICES = RecordKey("auth.user:1", "", "order-1")


@override_settings(IDEMPOTENCY={"ENCRYPTION_KEY": ENCRYPTION_KEY})
def test_an_answer_opens_only_for_its_record_and_kind() -> None:
    sealed = seal(ANSWER, ALICES, "task")
    assert unseal(sealed, ALICES, "task") == ANSWER
    for key, kind in [(RecordKey("auth.user:2", "", "order-1"), "task"), (ALICES, "request")]:
        with pytest.raises(ForeignResponse):
            unseal(sealed, key, kind)
    # The scheme mark is outside the token: setting it back to fernet-1 changes nothing.
    relabelled = StoredResponse(201, ((SEALED_HEADER, "fernet-1"),), sealed.body)
    with pytest.raises(ForeignResponse):
        unseal(relabelled, RecordKey("auth.user:2", "", "order-1"), "task")


def book(client: Client) -> Any:
    return client.post(
        "/plain/bookings/", {"slot": "s"}, "application/json", HTTP_IDEMPOTENCY_KEY="old-1"
    )


@pytest.mark.django_db
@override_settings(IDEMPOTENCY={"ENCRYPTION_KEY": ENCRYPTION_KEY})
def test_a_record_sealed_before_answers_were_bound_still_replays(alice_client: Client) -> None:
    """A fernet-1 token (1b08f39's: headers and body, no record) opens until it expires."""
    answer = book(alice_client)
    record = IdempotencyRecord.objects.get()
    opened = unseal(
        StoredResponse(
            201, tuple(map(tuple, record.response_headers)), bytes(record.response_body)
        ),
        RecordKey(record.principal, "", "old-1"),
    )
    headers = json.dumps([list(pair) for pair in opened.headers]).encode()
    legacy = Fernet(ENCRYPTION_KEY).encrypt(headers + b"\n" + opened.body)
    IdempotencyRecord.objects.update(
        response_headers=[[SEALED_HEADER, "fernet-1"]], response_body=legacy
    )
    again = book(alice_client)
    assert again["Idempotency-Replayed"] == "true"
    assert again.content == answer.content
    assert Booking.objects.count() == 1


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
