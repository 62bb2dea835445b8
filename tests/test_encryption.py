"""Stored responses encrypted at rest (ENCRYPTION_KEY), through the real stores.

The database store runs on the suite's database (SQLite by default,
``TEST_DATABASE=postgres`` or ``mariadb``); the Redis store on the Redis
server at ``TESTS_REDIS_URL``. Every assertion about what is stored reads
the raw bytes the store wrote: a SQL SELECT, a Redis GET.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import Permission, User
from django.core import checks
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse

from idempotency_django.checks import check_settings
from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import get_store
from idempotency_django.stores.encryption import SEALED_HEADER, generate_key, invalid_keys
from tests.redis_helpers import redis_store_settings, stored_entries
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

URL = "/plain/bookings/"
# The view echoes the slot in its answer: personal data, as a real one would.
CUSTOMER = "Dana Whitfield, dana@example.com"
SLOT = f"2031-07-30T09:00:00Z for {CUSTOMER}"
BODY = json.dumps({"slot": SLOT, "customer": CUSTOMER})
OLD_KEY, NEW_KEY, OTHER_KEY = (Fernet.generate_key().decode() for _ in range(3))


def post(client: Client, key: str = "enc-1") -> Any:
    return client.post(URL, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


class Store:
    """One real store, with the settings that turn its encryption on or off."""

    def __init__(self, name: str) -> None:
        self.name = name

    def raw(self) -> list[bytes]:
        """Every stored record's bytes, as the store holds them."""
        if self.name == "redis":
            return list(stored_entries().values())
        table = connection.ops.quote_name(IdempotencyRecord._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT response_headers, response_body FROM {table}")
            rows = cursor.fetchall()
        return [_text(headers).encode() + b"\n" + bytes(body) for headers, body in rows]


def _text(value: Any) -> str:
    # PostgreSQL's driver decodes JSON columns itself.
    return value if isinstance(value, str) else json.dumps(value)


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    chosen = Store(request.param)
    if chosen.name == "redis":
        # One flush around the whole test: its records must outlive each change of keys.
        with redis_store_settings():
            yield chosen
    else:
        yield chosen


@contextlib.contextmanager
def keys(store: Store, *values: str | None, **more: Any) -> Iterator[None]:
    """IDEMPOTENCY with ENCRYPTION_KEY = the first value, ENCRYPTION_KEY_FALLBACKS = the
    others (no values: neither setting); Redis is not flushed in between."""
    extra: dict[str, Any] = {}
    if values:
        extra = {"ENCRYPTION_KEY": values[0], "ENCRYPTION_KEY_FALLBACKS": list(values[1:])}
    extra.update(more)
    base = {"STORE": "redis", "STORE_OPTIONS": {"cache": "idempotency"}}
    if store.name == "database":
        base = {"STORE": "database"}
    with override_settings(IDEMPOTENCY={**base, **extra}):
        get_store.cache_clear()
        try:
            yield
        finally:
            get_store.cache_clear()


def plaintext_in(raw: list[bytes], *needles: str) -> list[str]:
    return [needle for needle in needles for value in raw if needle.encode() in value]


# -- what is stored, and that it replays ------------------------------------------


def test_stored_bytes_hold_no_plaintext_and_the_replay_is_whole(
    store: Store, alice_client: Client
) -> None:
    with keys(store, NEW_KEY):
        first = post(alice_client)
        assert first.status_code == 201
        [raw] = store.raw()
        booking_path = first["Location"]
        assert plaintext_in([raw], CUSTOMER, SLOT, booking_path, "application/json") == []
        assert SEALED_HEADER.encode() in raw
        second = post(alice_client)
    assert second.status_code == 201
    assert second["Idempotency-Replayed"] == "true"
    assert second.content == first.content
    assert second["Location"] == booking_path
    assert second["Content-Type"] == "application/json"
    assert Booking.objects.count() == 1


def test_without_keys_nothing_is_encrypted(store: Store, alice_client: Client) -> None:
    """The control of the test above: the same request, stored readable."""
    with keys(store):
        post(alice_client)
        [raw] = store.raw()
    assert json.dumps(SLOT).encode() in raw
    assert SEALED_HEADER.encode() not in raw


def test_a_response_too_large_to_keep_is_still_told(store: Store, alice_client: Client) -> None:
    with keys(store, NEW_KEY, MAX_STORED_BODY=10):
        assert post(alice_client).status_code == 201
        again = post(alice_client)
    assert again.status_code == 409
    assert again.json()["code"] == "idempotency_response_not_stored"
    assert Booking.objects.count() == 1


# -- rotation and the upgrade ------------------------------------------------------


def test_rotation_new_key_first_old_key_still_opens_live_records(
    store: Store, alice_client: Client
) -> None:
    with keys(store, OLD_KEY):
        before = post(alice_client, "written-with-old")
    with keys(store, NEW_KEY, OLD_KEY):
        replay = post(alice_client, "written-with-old")
        after = post(alice_client, "written-with-new")
        newest = [raw for raw in store.raw() if raw not in _raw_with(store, OLD_KEY)]
    assert replay.status_code == 201 and replay["Idempotency-Replayed"] == "true"
    assert replay.content == before.content
    assert after.status_code == 201 and "Idempotency-Replayed" not in after
    # The new record is encrypted with the new key alone: the old one cannot open it.
    assert len(newest) == 1
    with keys(store, NEW_KEY):
        assert post(alice_client, "written-with-new").content == after.content
    assert Booking.objects.count() == 2


def _raw_with(store: Store, key: str) -> list[bytes]:
    """The stored records that ``key`` opens."""
    fernet = Fernet(key)
    opened = []
    for raw in store.raw():
        token = raw.rsplit(b"\n", 1)[-1]
        with contextlib.suppress(Exception):
            fernet.decrypt(token)
            opened.append(raw)
    return opened


def test_with_fallbacks_alone_encryption_is_off_and_live_records_still_replay(
    store: Store, alice_client: Client
) -> None:
    with keys(store, OLD_KEY):
        before = post(alice_client, "encrypted")
    with keys(store, None, OLD_KEY):
        replay = post(alice_client, "encrypted")
        post(alice_client, "in-the-clear")
        readable = [raw for raw in store.raw() if json.dumps(SLOT).encode() in raw]
    assert replay["Idempotency-Replayed"] == "true"
    assert replay.content == before.content
    assert len(readable) == 1  # the new record only
    assert Booking.objects.count() == 2


def test_a_record_stored_before_encryption_still_replays(
    store: Store, alice_client: Client
) -> None:
    with keys(store):
        first = post(alice_client)
    with keys(store, NEW_KEY):
        second = post(alice_client)
    assert second.status_code == 201
    assert second["Idempotency-Replayed"] == "true"
    assert second.content == first.content
    assert second["Location"] == first["Location"]
    assert Booking.objects.count() == 1


# -- a record no key opens -----------------------------------------------------------


@pytest.mark.parametrize("then", [(OTHER_KEY,), ()], ids=["wrong key", "no key"])
def test_a_record_no_key_opens_answers_503_and_runs_nothing(
    store: Store, alice_client: Client, caplog: pytest.LogCaptureFixture, then: tuple[str, ...]
) -> None:
    with keys(store, OLD_KEY):
        assert post(alice_client).status_code == 201
        stored = store.raw()
    caplog.set_level(logging.DEBUG)
    with keys(store, *then):
        response = post(alice_client)
        assert store.raw() == stored  # neither overwritten nor released
    assert response.status_code == 503
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "idempotency_unavailable"
    assert response["Retry-After"] == "1"  # RETRY_AFTER
    assert CUSTOMER not in response.content.decode()
    assert Booking.objects.count() == 1
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "event=unavailable" in logged
    assert "error=UndecryptableResponse" in logged
    assert CUSTOMER not in logged and OLD_KEY not in logged
    # Once the key is back, the record replays: it was never lost.
    with keys(store, OTHER_KEY, OLD_KEY):
        assert post(alice_client)["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1


def test_an_altered_record_answers_503_and_runs_nothing(store: Store, alice_client: Client) -> None:
    """Fernet's HMAC: a token changed in the store opens under no key."""
    with keys(store, NEW_KEY):
        assert post(alice_client).status_code == 201
        _alter_stored_token(store)
        response = post(alice_client)
    assert response.status_code == 503
    assert response.json()["code"] == "idempotency_unavailable"
    assert Booking.objects.count() == 1


def _alter_stored_token(store: Store) -> None:
    """Flip one character of the stored token, in place, by the store's own means."""

    def altered(token: bytes) -> bytes:
        middle = len(token) // 2
        flipped = b"A" if token[middle : middle + 1] != b"A" else b"B"
        return token[:middle] + flipped + token[middle + 1 :]

    if store.name == "redis":
        from tests.redis_helpers import raw_client

        client = raw_client()
        [redis_key] = [key for key in stored_entries()]
        stored = client.get(redis_key)
        assert isinstance(stored, bytes)
        head, _, token = stored.partition(b"\n")
        client.set(redis_key, head + b"\n" + altered(token), keepttl=True)
        client.close()
    else:
        record = IdempotencyRecord.objects.get()
        IdempotencyRecord.objects.filter(pk=record.pk).update(
            response_body=altered(bytes(record.response_body))
        )


def test_a_malformed_key_at_run_time_answers_503_without_leaking_it(
    alice_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Check E015 stops it at start-up; a server run anyway never stores plaintext."""
    caplog.set_level(logging.DEBUG)
    with keys(Store("database"), "not-a-key"):
        response = post(alice_client)
    # The work ran before the answer was stored: it is answered, and the key stays
    # reserved (a retry gets 409 in progress until LOCK_TIMEOUT, never a second run).
    assert response.status_code == 201
    assert Booking.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert record.state == IdempotencyRecord.State.IN_PROGRESS
    assert bytes(record.response_body) == b""
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "event=store_failed" in logged and "not-a-key" not in logged


# -- the admin -----------------------------------------------------------------------


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, password="x", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def detail(client: Client) -> str:
    record = IdempotencyRecord.objects.get()
    url = reverse("admin:idempotency_django_idempotencyrecord_change", args=[record.pk])
    response = client.get(url)
    assert response.status_code == 200
    return str(response.content.decode())


def test_the_admin_decrypts_bodies_for_the_body_permission_only(alice_client: Client) -> None:
    with keys(Store("database"), NEW_KEY):
        first = post(alice_client)
        reader = detail(staff("reader", "view_idempotencyrecord", "view_stored_response"))
        viewer = detail(staff("viewer", "view_idempotencyrecord"))
    assert CUSTOMER in reader
    assert first["Location"] in reader
    assert CUSTOMER not in viewer and first["Location"] not in viewer
    # The viewer's summary is of the decrypted response: its size and content type.
    assert f"{len(first.content)} bytes, application/json, digest" in viewer
    assert SEALED_HEADER not in reader and SEALED_HEADER not in viewer


def test_the_admin_shows_a_record_no_key_opens_without_failing(alice_client: Client) -> None:
    with keys(Store("database"), OLD_KEY):
        post(alice_client)
    with keys(Store("database"), OTHER_KEY):
        page = detail(staff("reader", "view_idempotencyrecord", "view_stored_response"))
    assert "no longer holds" in page
    assert CUSTOMER not in page


# -- the system check, and the package without cryptography -------------------------


SHORT_KEY = Fernet.generate_key().decode()[:20]


@pytest.mark.parametrize(
    "setting",
    [
        {"ENCRYPTION_KEY": "not base64 !"},
        {"ENCRYPTION_KEY": SHORT_KEY},
        {"ENCRYPTION_KEY": 42},
        {"ENCRYPTION_KEY": OLD_KEY, "ENCRYPTION_KEY_FALLBACKS": OTHER_KEY},
        {"ENCRYPTION_KEY_FALLBACKS": [OTHER_KEY, SHORT_KEY]},
    ],
    ids=["not base64", "too short", "not a string", "fallbacks not a list", "a short fallback"],
)
def test_a_malformed_key_setting_is_error_e015(setting: dict[str, Any]) -> None:
    with override_settings(IDEMPOTENCY=setting):
        messages = check_settings()
    assert [m.id for m in messages if m.level >= checks.ERROR] == ["idempotency_django.E015"]
    # The message names the setting, never a key.
    assert all(key not in messages[0].msg for key in (SHORT_KEY, OLD_KEY, OTHER_KEY))


def test_well_formed_keys_pass_the_check() -> None:
    setting = {"ENCRYPTION_KEY": generate_key(), "ENCRYPTION_KEY_FALLBACKS": [OLD_KEY]}
    with override_settings(IDEMPOTENCY=setting):
        assert [m.id for m in check_settings() if str(m.id).endswith(("E015", "E016"))] == []
    assert invalid_keys(None, ()) == []


PROGRAM = """
import sys
sys.modules["cryptography"] = None  # as if it were not installed
import django
from django.conf import settings
settings.configure(IDEMPOTENCY={IDEMPOTENCY!r}, INSTALLED_APPS=["idempotency_django"])
django.setup()
from idempotency_django.stores.encryption import SEALED_HEADER, seal, unseal
from idempotency_django.stores.base import StoredResponse, StoreUnavailable
from idempotency_django.checks import _check_encryption_keys
from idempotency_django.conf import idempotency_settings as s
response = StoredResponse(201, (("Content-Type", "text/plain"),), b"body")
sealed = StoredResponse(201, ((SEALED_HEADER, "fernet-1"),), b"gAAAAAB-a-token")
for attempt in (lambda: unseal(seal(response)) == response, lambda: unseal(sealed)):
    try:
        print(attempt())
    except StoreUnavailable as exc:
        print(type(exc).__name__)
print([m.id for m in _check_encryption_keys(s.ENCRYPTION_KEY, s.ENCRYPTION_KEY_FALLBACKS)])
"""


@pytest.mark.parametrize(
    ("idempotency", "expected"),
    [
        ({}, "True\nUndecryptableResponse\n[]\n"),
        (
            {"ENCRYPTION_KEY": OLD_KEY},
            "StoreUnavailable\nStoreUnavailable\n['idempotency_django.E016']\n",
        ),
    ],
    ids=["off: works", "on: E016 and 503"],
)
def test_without_cryptography(idempotency: dict[str, Any], expected: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM.replace("{IDEMPOTENCY!r}", repr(idempotency))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected


def test_the_deliveries_admin_reads_encrypted_run_ids(admin_client: Client) -> None:
    from idempotency_django.stores import RecordKey, RequestInfo, StoredResponse

    with keys(Store("database"), NEW_KEY):
        store = get_store()
        key = RecordKey("webhook:trigger", "", "evt_1")
        info = RequestInfo("POST", "/hooks/", "f" * 64, kind="webhook", source="header")
        claim = store.claim(key, info, 60)
        assert store.complete(
            key, claim.token, StoredResponse(200, (), b'{"run_id": "run-42"}'), 60, request=info
        )
        assert b"run-42" not in bytes(IdempotencyRecord.objects.get().response_body)
        # The delivery's page: the list's date filter needs MariaDB's time zone tables.
        delivery = IdempotencyRecord.objects.get()
        url = reverse("admin:idempotency_django_webhookdelivery_change", args=[delivery.pk])
        page = admin_client.get(url)
    assert page.status_code == 200
    assert "run-42" in page.content.decode()


def test_a_well_encrypted_but_malformed_record_answers_503(alice_client: Client) -> None:
    """Only someone holding a key can write one; it is still no 500."""
    with keys(Store("database"), NEW_KEY):
        assert post(alice_client).status_code == 201
        IdempotencyRecord.objects.update(response_body=Fernet(NEW_KEY).encrypt(b"not json\n{}"))
        response = post(alice_client)
    assert response.status_code == 503
    assert response.json()["code"] == "idempotency_unavailable"
    assert Booking.objects.count() == 1
