"""Logs, signals, store failures and system checks."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.middleware import SessionMiddleware
from django.core import checks
from django.db import connection
from django.test import Client, override_settings
from rest_framework.authtoken.models import Token

from idempotency_django import signals
from idempotency_django.checks import check_middleware, check_settings
from idempotency_django.conf import DEFAULTS, REMOVED_SETTINGS, IdempotencySettings
from idempotency_django.decorators import idempotent
from idempotency_django.models import IdempotencyRecord
from idempotency_django.protocol import logs
from idempotency_django.protocol.options import MAX_SECONDS, ViewOptions
from idempotency_django.tasks import idempotent_task
from idempotency_django.webhooks import deduplicate_webhook
from tests.testapp.models import Booking

BODY = json.dumps({"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"})
SECRET_BODY = json.dumps({"slot": "s", "customer": "card-4242-4242-secret"})


def keyed_post(  # type: ignore[no-untyped-def]
    client: Client,
    url: str = "/plain/bookings/",
    key: str = "log-key-1",
    body: str = BODY,
    **extra: Any,
):
    return client.post(
        url, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key, **extra
    )


@pytest.mark.django_db
def test_one_structured_line_per_request_without_secrets(
    alice: User, caplog: pytest.LogCaptureFixture
) -> None:
    token = Token.objects.create(user=alice)
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Token {token.key}", "HTTP_X_REQUEST_ID": "req-42"}
    client.cookies["sessionid"] = "cookie-secret-value"
    with caplog.at_level(logging.INFO, logger="idempotency_django"):
        keyed_post(client, "/api/bookings/", body=SECRET_BODY, **auth)
        keyed_post(client, "/api/bookings/", body=SECRET_BODY, **auth)
        with override_settings(IDEMPOTENCY={"REQUEST_ID_HEADER": "X-Request-Id"}):
            keyed_post(client, "/api/bookings/", body=BODY, **auth)
    ours = [record for record in caplog.records if record.name == "idempotency_django"]
    events = [record.idempotency["event"] for record in ours]  # type: ignore[attr-defined]
    # Issue 36: one record per request, its outcome; the reservation is DEBUG.
    assert events == ["stored", "replayed", "conflict"]
    attempts = [record.idempotency["attempt"] for record in ours]  # type: ignore[attr-defined]
    assert attempts == ["first", "retry", "retry"]
    for record in ours:
        fields = record.idempotency  # type: ignore[attr-defined]
        assert fields["route"] == "api/bookings/$"
        # Named, not looked for up the stack: where every line is written.
        assert (record.pathname, record.module, record.funcName) == (logs.__file__, "logs", "emit")
        assert len(fields["key_digest"]) == 16
    # The client's X-Request-Id only once the project names the header (a trusted proxy's).
    request_ids = [record.idempotency.get("request_id") for record in ours]  # type: ignore[attr-defined]
    assert request_ids == [None, None, "req-42"]
    text = caplog.text
    for secret in ("log-key-1", token.key, "cookie-secret-value", "card-4242", "Dana"):
        assert secret not in text


@pytest.mark.django_db
def test_each_keyed_request_and_delivery_writes_one_info_record_at_its_end(
    alice_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 36: its outcome, once; the reservation before it is a DEBUG record."""
    alice_client.raise_request_exception = False
    hook = "/hooks/trg_one_record/"
    requests = {
        "first": lambda: keyed_post(alice_client, key="one-1"),
        "replay": lambda: keyed_post(alice_client, key="one-1"),
        "refused": lambda: keyed_post(alice_client, key="one-1", body="{}"),
        "released": lambda: keyed_post(alice_client, url="/plain/bookings/?raise=1", key="one-2"),
        "too many": lambda: keyed_post(alice_client, key="one-3"),
        "delivery": lambda: alice_client.post(hook, "{}", "application/json", HTTP_WEBHOOK_ID="d"),
        "duplicate": lambda: alice_client.post(hook, "{}", "application/json", HTTP_WEBHOOK_ID="d"),
    }
    written: dict[str, list[tuple[str, str]]] = {}
    for name, send in requests.items():
        caplog.clear()
        limit = {"MAX_KEYS_PER_PRINCIPAL": 1} if name == "too many" else {}
        with (
            override_settings(IDEMPOTENCY=limit),
            caplog.at_level(logging.DEBUG, logger="idempotency_django"),
        ):
            send()
        written[name] = [
            (r.levelname, r.idempotency["event"])
            for r in caplog.records
            if hasattr(r, "idempotency")
        ]
    assert written == {
        "first": [("DEBUG", "reserved"), ("INFO", "stored")],
        "replay": [("INFO", "replayed")],
        "refused": [("INFO", "conflict")],
        "released": [("DEBUG", "reserved"), ("INFO", "released")],
        "too many": [("DEBUG", "released"), ("INFO", "rejected")],
        "delivery": [("DEBUG", "reserved"), ("INFO", "accepted")],
        "duplicate": [("INFO", "duplicate")],
    }


@pytest.mark.django_db
def test_signals_cover_every_decision(alice_client: Client) -> None:
    seen: list[tuple[str, object]] = []

    def recorder(name: str):  # type: ignore[no-untyped-def]
        def receive(sender, **kwargs):  # type: ignore[no-untyped-def]
            seen.append((name, kwargs.get("code") or kwargs.get("status")))

        return receive

    receivers = {
        name: recorder(name) for name in ("reserved", "replayed", "conflict", "stored", "released")
    }
    for name, receiver in receivers.items():
        getattr(signals, name).connect(receiver)
    try:
        keyed_post(alice_client)
        keyed_post(alice_client)
        keyed_post(alice_client, body="{}")
        keyed_post(alice_client, url="/plain/bookings/?status=503", key="other")
    finally:
        for name, receiver in receivers.items():
            getattr(signals, name).disconnect(receiver)
    assert seen == [
        ("reserved", None),
        ("stored", 201),
        ("replayed", 201),
        ("conflict", "idempotency_key_reused"),
        ("reserved", None),
        ("released", 503),
    ]


@pytest.fixture
def broken_store_table(transactional_db: None) -> Iterator[None]:
    """The store's table disappears: every store query fails for real."""
    table = IdempotencyRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {table}_gone")
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table}_gone RENAME TO {table}")


@pytest.mark.usefixtures("broken_store_table")
@pytest.mark.parametrize("url", ["/plain/bookings/", "/api/bookings/"])
def test_store_failure_is_503_and_nothing_runs(alice: User, url: str) -> None:
    client = Client()
    client.force_login(alice)
    unavailable: list[object] = []

    def receive(sender, **kwargs):  # type: ignore[no-untyped-def]
        unavailable.append(kwargs["error"])

    signals.unavailable.connect(receive)
    try:
        response = keyed_post(client, url)
    finally:
        signals.unavailable.disconnect(receive)
    assert response.status_code == 503
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "idempotency_unavailable"
    assert response["Retry-After"] == "1"  # RETRY_AFTER
    assert Booking.objects.count() == 0
    assert len(unavailable) == 1


def test_checks_accept_the_test_settings() -> None:
    assert check_middleware() == []
    assert check_settings() == []


@override_settings(
    MIDDLEWARE=[
        "idempotency_django.middleware.IdempotencyMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
    ]
)
def test_check_misordered_middleware() -> None:
    assert [m.id for m in check_middleware()] == ["idempotency_django.E001"]


@override_settings(
    MIDDLEWARE=[
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "idempotency_django.middleware.IdempotencyMiddleware",
        "django.middleware.gzip.GZipMiddleware",
    ]
)
def test_check_gzip_after_the_middleware() -> None:
    assert [m.id for m in check_middleware()] == ["idempotency_django.W003"]


@override_settings(MIDDLEWARE=[])
def test_check_missing_middleware() -> None:
    assert [m.id for m in check_middleware()] == ["idempotency_django.W001"]


class ProjectSessionMiddleware(SessionMiddleware):
    """A drop-in replacement, as django-user-sessions and django-qsessions install."""


def test_a_session_middleware_of_ones_own_serves_anonymous_session() -> None:
    """E014 asks for sessions before the middleware: a subclass of Django's gives them."""
    middleware = [
        f"{__name__}.ProjectSessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "idempotency_django.middleware.IdempotencyMiddleware",
    ]
    with override_settings(MIDDLEWARE=middleware, IDEMPOTENCY={"ANONYMOUS": "session"}):
        assert "idempotency_django.E014" not in [m.id for m in check_middleware()]
    with override_settings(MIDDLEWARE=middleware[1:], IDEMPOTENCY={"ANONYMOUS": "session"}):
        assert "idempotency_django.E014" in [m.id for m in check_middleware()]
    # One that cannot be imported is no session middleware (Django reports the import).
    broken = ["project.missing.SessionMiddleware", *middleware[1:]]
    with override_settings(MIDDLEWARE=broken, IDEMPOTENCY={"ANONYMOUS": "session"}):
        assert "idempotency_django.E014" in [m.id for m in check_middleware()]


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ({"LOCK_TIMOUT": 3}, "idempotency_django.E003"),
        ({"LOCK_TIMEOUT": 0}, "idempotency_django.E024"),
        ({"RETENTION": "1d"}, "idempotency_django.E004"),
        # Past a century the store cannot write the expiry (MariaDB, SQLite) or read
        # it back (PostgreSQL): every completion failed and the work ran again.
        ({"RETENTION": 10**11}, "idempotency_django.E025"),
        ({"LOCK_TIMEOUT": 10**11}, "idempotency_django.E025"),
        ({"WEBHOOK_RETENTION": 4 * 10**9}, "idempotency_django.E025"),
        ({"WAIT_FOR_IN_PROGRESS": -1}, "idempotency_django.E026"),
        ({"WAIT_FOR_IN_PROGRESS": 300}, "idempotency_django.E027"),
        ({"ENABLED": "yes"}, "idempotency_django.E004"),
        ({"REQUEST_ID_HEADER": 1}, "idempotency_django.E004"),
        ({"MARKER_HEADERS": {"REPLAYED": None}}, "idempotency_django.E004"),
        ({"MARKER_HEADERS": {"KEY_ECHOED": "Idempotency-Key"}}, "idempotency_django.E004"),
        ({"RETAIN_FUNCTION": None}, "idempotency_django.E004"),
        ({"WEBHOOK_BODY_ID_FUNCTION": 3}, "idempotency_django.E004"),
        ({"REUSE_STATUS": 400}, "idempotency_django.E005"),
        ({"ANONYMOUS": "allow"}, "idempotency_django.E005"),
        ({"METHODS": ["POST", "GET"]}, "idempotency_django.E007"),
        ({"REPLAY_HEADERS": ["Content-Type", "Set-Cookie"]}, "idempotency_django.E008"),
        # A string where a list goes: each character an entry (a tuple without its comma).
        ({"REPLAY_HEADERS": ("Content-Type")}, "idempotency_django.E004"),
        ({"METHODS": "POST"}, "idempotency_django.E004"),
        ({"METHODS": None}, "idempotency_django.E004"),
        ({"REPLAY_HEADERS": None}, "idempotency_django.E004"),
        ({"REQUIRED_PATHS": None}, "idempotency_django.E004"),
        # Imported, but a module: every keyed request would answer 500.
        (
            {"FINGERPRINT_FUNCTION": "idempotency_django.protocol.fingerprint"},
            "idempotency_django.E004",
        ),
        ({"SCOPE_FUNCTION": "no.such.function"}, "idempotency_django.E009"),
        ({"STORE": "no.such.Store"}, "idempotency_django.E009"),
        ({"STORE_OPTIONS": {"database": "nope"}}, "idempotency_django.E010"),
    ],
)
def test_check_invalid_settings(value: dict, code: str) -> None:  # type: ignore[type-arg]
    with override_settings(IDEMPOTENCY=value):
        assert code in [m.id for m in check_settings()]


#: Each removed setting with the default it had in 0.2.0.
DEFAULT_OF_0_2: dict[str, Any] = {
    "MAX_WAITERS_PER_KEY": 1,
    "MAX_WAITERS": 2,
    "UNAVAILABLE_RETRY_AFTER": 5,
    "RETAIN_CLIENT_ERRORS": False,
    "MAX_RUN_TIME": 300,
    "REPLAYED_HEADER": "Idempotency-Replayed",
    "IGNORED_KEY_HEADER": "Idempotency-Key-Ignored",
    "ECHO_KEY_HEADER": None,
    "PROBLEM_TYPE_BASE": None,
    "DRF_EXCEPTION_HANDLER": False,
    "WEBHOOK_FALLBACK_BUCKET": 300,
    "WEBHOOK_TOKEN_KWARG": "token",
    "TASK_DUPLICATES": "wait",
}


def test_a_task_refuses_an_unknown_duplicates_choice() -> None:
    with pytest.raises(ValueError, match="duplicates must be 'wait' or 'skip'"):
        idempotent_task(duplicates="drop")  # type: ignore[call-overload]


@pytest.mark.parametrize("name", sorted(REMOVED_SETTINGS))
def test_a_removed_setting_is_a_warning_that_names_its_replacement(name: str) -> None:
    with override_settings(IDEMPOTENCY={name: DEFAULT_OF_0_2[name]}):
        [message] = check_settings()
    assert message.id == "idempotency_django.W050" and message.level == checks.WARNING
    assert REMOVED_SETTINGS[name] in message.msg
    assert name in Path("docs/upgrading.md").read_text()


def test_at_most_32_settings_each_with_its_type() -> None:
    assert len(DEFAULTS) <= 32
    assert set(get_type_hints(IdempotencySettings)) == set(DEFAULTS)


def test_the_longest_expiry_a_setting_may_ask_for_is_a_century() -> None:
    with override_settings(IDEMPOTENCY={"RETENTION": MAX_SECONDS, "LOCK_TIMEOUT": MAX_SECONDS}):
        assert not [m.id for m in check_settings() if m.level >= checks.ERROR]


@pytest.mark.parametrize("retention", [0, -60, 10**11, 1.5, "3600", True])
def test_a_per_view_retention_out_of_range_is_refused_when_decorated(retention: Any) -> None:
    """0 kept an answer for no time (every retry ran the work again), a huge one
    could not be stored: refused where the view is decorated, as the setting is."""

    def view(request: Any) -> None: ...

    for decorate in (
        lambda: idempotent(retention=retention)(view),
        lambda: ViewOptions(retention=retention),  # DRF's idempotency_options, ninja's
        lambda: deduplicate_webhook(retention=retention)(view),
        lambda: idempotent_task(retention=retention)(view),
    ):
        with pytest.raises(ValueError, match="retention must be a whole number of seconds"):
            decorate()
    assert ViewOptions(retention=MAX_SECONDS).retention == MAX_SECONDS


def test_check_warns_about_an_unshared_database() -> None:
    from django.db import connections

    from idempotency_django.stores.database import DatabaseStore

    settings_dict = connections.settings["default"]
    saved = dict(settings_dict)
    settings_dict.update(ENGINE="django.db.backends.sqlite3", NAME=":memory:")
    try:
        assert [m.id for m in DatabaseStore().check()] == ["idempotency_django.W010"]
    finally:
        settings_dict.update(saved)


@pytest.mark.django_db
def test_takeover_is_logged_as_such(alice: User, caplog: pytest.LogCaptureFixture) -> None:
    from datetime import timedelta

    from django.utils import timezone

    IdempotencyRecord.objects.create(
        principal=f"auth.user:{alice.pk}",
        key="log-key-1",
        fingerprint="x",
        method="POST",
        path="/plain/bookings/",
        state=IdempotencyRecord.State.IN_PROGRESS,
        token="crashed-worker",
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    client = Client()
    client.force_login(alice)
    with caplog.at_level(logging.INFO, logger="idempotency_django"):
        assert keyed_post(client).status_code == 201
    ours = [r.idempotency for r in caplog.records if hasattr(r, "idempotency")]
    assert [(f["event"], f["attempt"]) for f in ours] == [("stored", "takeover")]


@pytest.mark.parametrize(
    ("database", "idempotency", "code"),
    [
        ({"ENGINE": "django.db.backends.sqlite3", "ATOMIC_REQUESTS": True}, {}, "W011"),
        ({"ENGINE": "django.db.backends.sqlite3"}, {"ATOMIC": True}, "W011"),
        (
            {"ENGINE": "django.db.backends.mysql", "ATOMIC_REQUESTS": True,
             "OPTIONS": {"isolation_level": "repeatable read"}},
            {},
            "W012",
        ),
    ],
)  # fmt: skip
def test_check_transaction_settings_that_turn_409_into_503(
    database: dict[str, Any],
    idempotency: dict[str, Any],
    code: str,
) -> None:
    from django.db import connections

    from idempotency_django.stores.database import DatabaseStore

    settings_dict = connections.settings["default"]
    saved = dict(settings_dict)
    settings_dict.update({"OPTIONS": {}, **database})
    try:
        with override_settings(IDEMPOTENCY=idempotency):
            assert f"idempotency_django.{code}" in {m.id for m in DatabaseStore().check()}
        settings_dict.update(
            {"ATOMIC_REQUESTS": False, "OPTIONS": {"transaction_mode": "IMMEDIATE"}}
        )
        assert f"idempotency_django.{code}" not in {m.id for m in DatabaseStore().check()}
    finally:
        settings_dict.clear()
        settings_dict.update(saved)
