"""The test helpers users get (idempotency_django.testing): the pytest plugin, its
fixtures, assert_idempotent, and the same helpers without pytest.

assert_idempotent is run against this suite's views, on each kind of protection
(middleware, @idempotent, DRF), with each client, under ATOMIC_REQUESTS, on the
Redis store; and against views and settings that break each part of the contract,
where it must fail and say why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, TestCase, override_settings
from rest_framework.test import APIClient

import idempotency_django.testing
from idempotency_django.conf import idempotency_settings
from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import Claim, Outcome, RecordKey, RequestInfo, get_store
from idempotency_django.stores.database import DatabaseStore
from idempotency_django.testing import (
    OTHER_REQUEST_FIELD,
    assert_idempotent,
    clear_store,
    idempotency_disabled,
)
from tests.redis_helpers import ALIAS, caches_with, raw_client, skip_without_redis
from tests.testapp.models import Booking

REPO_ROOT = Path(__file__).resolve().parent.parent
SLOT = {"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"}


@pytest.fixture
def api(alice: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


@pytest.fixture
def redis_store(settings: Any) -> None:
    """STORE=redis on the test Redis database (not flushed: the fixtures must clean up)."""
    skip_without_redis()
    settings.CACHES = caches_with()
    settings.IDEMPOTENCY = {"STORE": "redis", "STORE_OPTIONS": {"cache": ALIAS}}


# -- the plugin -------------------------------------------------------------------


def test_the_plugin_is_registered_by_its_entry_point(pytestconfig: pytest.Config) -> None:
    # This suite has no pytest_plugins line: the installed package brings it.
    plugin = pytestconfig.pluginmanager.get_plugin("idempotency_django")
    assert plugin is idempotency_django.testing


NON_DJANGO_TEST = """
import sys


def test_the_plugin_is_loaded_and_django_is_left_alone(pytestconfig):
    import idempotency_django.testing

    assert pytestconfig.pluginmanager.get_plugin("idempotency_django") is idempotency_django.testing
    assert "idempotency_django.models" not in sys.modules
    assert "django.db.models" not in sys.modules
    from django.conf import settings

    assert not settings.configured


def test_an_ordinary_test():
    assert 1 + 1 == 2
"""


def python(*args: str) -> list[str]:
    """This Python, under coverage when this run measures it.

    pytest imports its plugins before pytest-cov starts measuring, so this run never
    sees the plugin module's import; these subprocesses do (pytest-cov combines their
    data with this run's).
    """
    try:
        import coverage
    except ImportError:
        return [sys.executable, *args]
    measuring = coverage.Coverage.current()
    if measuring is None:
        return [sys.executable, *args]
    return [
        sys.executable,
        "-m",
        "coverage",
        "run",
        "--parallel-mode",
        f"--rcfile={REPO_ROOT / 'pyproject.toml'}",
        f"--data-file={os.path.abspath(measuring.config.data_file)}",
        "--source=idempotency_django",
        *args,
    ]


def run_pytest(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    return subprocess.run(
        python("-m", "pytest", "-p", "no:cacheprovider", *args),
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("options", [[], ["-p", "no:django"]], ids=["pytest-django", "alone"])
def test_a_project_without_django_runs_its_tests(tmp_path: Path, options: list[str]) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: not this repository
    (tmp_path / "test_plain.py").write_text(NON_DJANGO_TEST)
    run = run_pytest(tmp_path, *options)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout


def test_the_fixtures_are_listed_without_pytest_django(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    listed = run_pytest(tmp_path, "--fixtures", "-p", "no:django")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "idempotency_store" in listed.stdout and "no_idempotency" in listed.stdout


WITHOUT_PYTEST_OR_REDIS = """
import sys

sys.modules["pytest"] = sys.modules["redis"] = None  # their imports now fail
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "idempotency_django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
django.setup()
import idempotency_django.testing as testing
from idempotency_django.testing import assert_idempotent, clear_store, idempotency_disabled

assert not hasattr(testing, "idempotency_store")


class OwnStore:
    cleared = False

    def clear(self):
        OwnStore.cleared = True


clear_store(OwnStore())
assert OwnStore.cleared
"""


def test_the_helpers_work_without_pytest_or_redis(tmp_path: Path) -> None:
    script = tmp_path / "without_pytest_or_redis.py"
    script.write_text(WITHOUT_PYTEST_OR_REDIS)
    run = subprocess.run(
        python(str(script)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr


# -- assert_idempotent on protected views --------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("client_kind", "url"),
    [
        ("client", "/plain/bookings/"),  # IdempotencyMiddleware
        ("client", "/plain/cbv/"),  # @idempotent on a class-based view
        ("client", "/plain/atomic/"),  # @idempotent(atomic=True): the claim is in a transaction
        ("client", "/api/bookings/"),  # a DRF viewset
        ("api", "/api/bookings/"),
        ("api", "/api/book/"),  # @api_view
    ],
)
@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "ATOMIC_REQUESTS"])
def test_passes_on_a_protected_view(
    request: pytest.FixtureRequest,
    alice_client: Client,
    api: APIClient,
    client_kind: str,
    url: str,
    atomic: bool,
) -> None:
    if atomic:
        request.getfixturevalue("atomic_requests")
    client = api if client_kind == "api" else alice_client

    first = assert_idempotent(client, "post", url, SLOT)

    assert first.status_code == 201
    assert first.json()["id"] == Booking.objects.get().pk  # the view ran once


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/async/bookings/", "/async/decorated/"])
def test_passes_on_an_async_view(alice_client: Client, url: str) -> None:
    # Django runs no async view under ATOMIC_REQUESTS.
    assert_idempotent(alice_client, "POST", url, SLOT)
    assert Booking.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_passes_on_other_methods(api: APIClient, alice: User, method: str) -> None:
    booking = Booking.objects.create(slot="s", owner=alice)
    data = None if method == "delete" else SLOT
    first = assert_idempotent(api, method, f"/api/bookings/{booking.pk}/", data)
    assert first.status_code == (204 if method == "delete" else 200)


@pytest.mark.django_db(transaction=True)
def test_passes_outside_a_test_transaction(alice_client: Client) -> None:
    assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT)
    assert Booking.objects.count() == 1


@pytest.mark.django_db
def test_passes_on_the_redis_store(
    redis_store: None, idempotency_store: Any, alice_client: Client
) -> None:
    assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT)
    assert Booking.objects.count() == 1


@pytest.mark.django_db
def test_form_and_multipart_data(alice_client: Client) -> None:
    form = assert_idempotent(
        alice_client,
        "POST",
        "/plain/form/",
        {"slot": "a"},
        content_type="application/x-www-form-urlencoded",
    )
    assert form.json()["slot"] == "a"
    upload = SimpleUploadedFile("ticket.pdf", b"%PDF-1.7 ...")
    multipart = assert_idempotent(
        alice_client,
        "POST",
        "/plain/form/",
        {"slot": "b", "attachment": upload},
        content_type="multipart/form-data",
    )
    # The file was read once, and each request sent its bytes.
    assert multipart.json()["attachment_size"] == len(b"%PDF-1.7 ...")
    assert Booking.objects.count() == 2


@pytest.mark.django_db
def test_bytes_data_needs_other_data(alice_client: Client) -> None:
    body = json.dumps(SLOT).encode()
    with pytest.raises(TypeError, match="other_data"):
        assert_idempotent(alice_client, "POST", "/plain/bookings/", body)
    with pytest.raises(ValueError, match="differ"):
        assert_idempotent(alice_client, "POST", "/plain/bookings/", body, other_data=body)
    assert not Booking.objects.exists()  # refused before any request

    assert_idempotent(alice_client, "POST", "/plain/bookings/", body, other_data=body + b" ")
    assert Booking.objects.count() == 1


@pytest.mark.django_db
def test_text_data(alice_client: Client) -> None:
    text = json.dumps(SLOT)
    with pytest.raises(TypeError, match="other_data"):
        assert_idempotent(alice_client, "POST", "/plain/bookings/", text)
    assert_idempotent(alice_client, "POST", "/plain/bookings/", text, other_data="{}")
    assert Booking.objects.count() == 1


def test_data_that_cannot_be_form_encoded(alice_client: Client) -> None:
    with pytest.raises(TypeError, match="Cannot send list as text/plain"):
        assert_idempotent(alice_client, "POST", "/plain/bookings/", [1], content_type="text/plain")


@pytest.mark.django_db
def test_the_key_and_extra_headers_are_the_callers(alice_client: Client) -> None:
    first = assert_idempotent(
        alice_client, "POST", "/plain/bookings/", SLOT, key="booking-77", HTTP_X_LOCATION_ID="pdx"
    )
    record = IdempotencyRecord.objects.get()
    assert (record.key, record.location) == ("booking-77", "pdx")
    assert Booking.objects.get().location == "pdx"
    assert first["Location"] == f"/plain/bookings/{Booking.objects.get().pk}/"


@pytest.mark.django_db
def test_with_csrf_enforced(alice: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    client.cookies["csrftoken"] = "a" * 32
    assert_idempotent(client, "POST", "/plain/bookings/", SLOT, HTTP_X_CSRFTOKEN="a" * 32)


@pytest.mark.django_db
@override_settings(IDEMPOTENCY={"REUSE_STATUS": 422, "HEADER": "X-Request-Key"})
def test_follows_the_settings(alice_client: Client) -> None:
    assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT)
    assert IdempotencyRecord.objects.count() == 1


# -- assert_idempotent fails on views that break the contract -------------------------


def fingerprint_without_body(request: Any) -> str:
    return f"{request.method} {request.get_full_path()}"


class DuplicatesRunStore(DatabaseStore):
    """Lets a duplicate claim a key that is still in progress."""

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        claim = super().claim(key, request, lock_timeout)
        if claim.outcome is Outcome.IN_PROGRESS:
            return Claim(Outcome.CLAIMED, token="duplicate")
        return claim


class TamperingStore(DatabaseStore):
    """Replays another body than the one stored."""

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        claim = super().claim(key, request, lock_timeout)
        if claim.outcome is Outcome.REPLAY and claim.response is not None:
            return replace(claim, response=replace(claim.response, body=b"{}"))
        return claim


class BrokenStore(DatabaseStore):
    """Fails in an unexpected way when a key is in progress."""

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        claim = super().claim(key, request, lock_timeout)
        if claim.outcome is Outcome.IN_PROGRESS:
            raise RuntimeError("the duplicate's claim broke")
        return claim


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("url", "settings_", "message"),
    [
        ("/api/unprotected-bookings/", {}, "never claimed its key"),
        ("/plain/exempt/", {}, "never claimed its key"),
        ("/plain/bookings/", {"ENABLED": False}, "never claimed its key"),
        ("/plain/bookings/?status=500", {}, "was not replayed"),
        ("/plain/bookings/?status=400", {}, "was not replayed"),
        ("/plain/bookings/?stream=1", {}, "was not replayed"),
        ("/plain/small-limit/", {}, "idempotency_response_not_stored"),
        ("/plain/bookings/", {"REPLAY_HEADERS": ["Location"]}, "differs .* in Content-Type"),
        (
            "/plain/bookings/",
            {"FINGERPRINT_FUNCTION": f"{__name__}.fingerprint_without_body"},
            "got 201 .* expected 409 idempotency_key_reused. The view's fingerprint",
        ),
        ("/plain/bookings/", {"STORE": f"{__name__}.TamperingStore"}, "differs .* in body"),
        (
            "/plain/bookings/",
            {"STORE": f"{__name__}.DuplicatesRunStore"},
            "while the first request held its key got 201",
        ),
    ],
)
def test_fails_and_says_why(
    alice_client: Client, url: str, settings_: dict[str, Any], message: str
) -> None:
    with override_settings(IDEMPOTENCY=settings_), pytest.raises(AssertionError, match=message):
        assert_idempotent(alice_client, "POST", url, SLOT)


@pytest.mark.django_db
def test_fails_for_an_anonymous_client(client: Client) -> None:
    with pytest.raises(AssertionError, match="is the client logged in"):
        assert_idempotent(client, "POST", "/plain/bookings/", SLOT)


@pytest.mark.django_db
def test_fails_for_a_key_used_before(alice_client: Client) -> None:
    assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT, key="once")
    with pytest.raises(AssertionError, match=r"did not run the view: it got 201.*Replayed"):
        assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT, key="once")
    with pytest.raises(AssertionError, match="409 idempotency_key_reused"):
        assert_idempotent(alice_client, "POST", "/plain/bookings/", {"slot": "b"}, key="once")


@pytest.mark.django_db
@override_settings(IDEMPOTENCY={"STORE": f"{__name__}.BrokenStore"})
def test_an_error_in_the_duplicate_is_raised_once_the_first_request_finished(
    alice_client: Client,
) -> None:
    with pytest.raises(RuntimeError, match="the duplicate's claim broke"):
        assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT)
    assert IdempotencyRecord.objects.get().state == IdempotencyRecord.State.COMPLETED
    assert Booking.objects.count() == 1


# -- clearing the store ------------------------------------------------------------


@pytest.mark.django_db
def test_clear_store_empties_the_database_store(alice_client: Client) -> None:
    assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT)
    clear_store()
    assert not IdempotencyRecord.objects.exists()
    assert Booking.objects.count() == 1


@pytest.mark.django_db
def test_clear_store_deletes_only_the_stores_keys_on_redis(
    redis_store: None, alice_client: Client
) -> None:
    settings = {"STORE": "redis", "STORE_OPTIONS": {"cache": ALIAS, "key_prefix": "idem[1]"}}
    others = [b"idempotency:v1:not-ours", b"idem[1]:v2:later-format", b"idem1:v1:x", b"users:1"]
    redis = raw_client()
    try:
        with override_settings(IDEMPOTENCY=settings):
            assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT)
            ours = [k for k in redis.scan_iter(match="idem*") if k.startswith(b"idem[1]:v1:")]
            assert ours
            redis.mset(dict.fromkeys(others, b"keep me"))
            clear_store()
        assert not [k for k in redis.scan_iter(match="idem*") if k.startswith(b"idem[1]:v1:")]
        assert redis.mget(others) == [b"keep me"] * len(others)
    finally:
        redis.delete(*others)
        redis.close()


def test_clear_store_calls_another_stores_clear_method() -> None:
    calls: list[str] = []
    clear_store(SimpleNamespace(clear=lambda: calls.append("cleared")))  # type: ignore[arg-type]
    assert calls == ["cleared"]
    with pytest.raises(TypeError, match="give it a clear"):
        clear_store(SimpleNamespace())  # type: ignore[arg-type]


# -- the fixtures ------------------------------------------------------------------


@pytest.fixture
def stale_redis_entry(redis_store: None) -> Iterator[bytes]:
    """A leftover of another test, written before idempotency_store starts; and, once
    idempotency_store has finished, a check that it left no entry behind."""
    redis = raw_client()
    leftover = b"idempotency:v1:left-by-another-test"
    redis.set(leftover, b"{}")
    yield leftover
    remaining = [k for k in redis.scan_iter(match="idempotency:v1:*")]
    redis.close()
    assert remaining == [], "idempotency_store left entries behind"


@pytest.mark.django_db
def test_idempotency_store_empties_the_store_before_and_after(
    stale_redis_entry: bytes, idempotency_store: Any, alice_client: Client
) -> None:
    assert idempotency_store is get_store()
    assert type(idempotency_store).__name__ == "RedisStore"
    assert not raw_client().exists(stale_redis_entry)
    assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT)  # leaves an entry


@pytest.mark.django_db
def test_idempotency_store_on_the_database(idempotency_store: Any, alice_client: Client) -> None:
    assert isinstance(idempotency_store, DatabaseStore)
    assert not IdempotencyRecord.objects.exists()
    assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT)


@pytest.fixture
def enabled_again_afterwards() -> Iterator[None]:
    yield
    assert idempotency_settings.ENABLED is True, "no_idempotency was not undone"


@pytest.mark.django_db
def test_no_idempotency_turns_the_protection_off(
    enabled_again_afterwards: None, no_idempotency: None, settings: Any, alice_client: Client
) -> None:
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "REQUIRED_PATHS": [r"^/plain/"]}
    body = json.dumps(SLOT)
    for _ in range(2):
        response = alice_client.post(
            "/plain/bookings/", body, "application/json", HTTP_IDEMPOTENCY_KEY="k"
        )
        assert response.status_code == 201 and "Idempotency-Replayed" not in response
    assert Booking.objects.count() == 2
    assert not IdempotencyRecord.objects.exists()
    with pytest.raises(AssertionError, match="never claimed its key"):
        assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT)


@pytest.mark.django_db
def test_idempotency_disabled_as_a_context_manager(alice_client: Client) -> None:
    with override_settings(IDEMPOTENCY={"RETENTION": 60}), idempotency_disabled():
        assert idempotency_settings.RETENTION == 60  # the other settings stay
        with pytest.raises(AssertionError, match="never claimed its key"):
            assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT)
    assert_idempotent(alice_client, "POST", "/plain/bookings/", SLOT)


# -- the example project's tests ---------------------------------------------------


@pytest.mark.parametrize("backend", ["db", "redis"])
def test_the_example_projects_tests_pass(tmp_path: Path, backend: str) -> None:
    """example_project/bookings/tests.py, run as `pytest example_project` (its own settings)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("EXAMPLE_")
        and name not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL"}
    }
    database: dict[str, Any] = django_settings.DATABASES["default"]
    if database["ENGINE"].endswith("postgresql"):
        env["DATABASE_URL"] = (
            f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}"
        )
        env["EXAMPLE_TEST_DATABASE_NAME"] = f"{database['TEST']['NAME']}_example"
    else:
        env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'example.sqlite3'}"
    if backend == "redis":
        url = os.environ.get("TESTS_EXAMPLE_REDIS_URL", "redis://127.0.0.1:6379/14")
        try:
            redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
        except redis.RedisError:
            pytest.skip(f"Redis is not reachable at {url}")
        env.update(EXAMPLE_IDEMPOTENCY_BACKEND="redis", REDIS_URL=url)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "example_project"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, run.stdout + run.stderr
    assert " passed" in summary and "skipped" not in summary, summary


# -- without pytest: a Django TestCase ------------------------------------------------


class WithoutPytest(TestCase):
    def setUp(self) -> None:
        self.user = User.objects.create_user("carol")
        self.client.force_login(self.user)
        clear_store()

    def test_assert_idempotent(self) -> None:
        first = assert_idempotent(self.client, "POST", "/plain/bookings/", SLOT)
        self.assertEqual(first.status_code, 201)
        self.assertEqual(Booking.objects.count(), 1)

    @idempotency_disabled()
    def test_idempotency_disabled(self) -> None:
        self.assertFalse(idempotency_settings.ENABLED)
        with self.assertRaisesRegex(AssertionError, "never claimed its key"):
            assert_idempotent(self.client, "POST", "/plain/bookings/", SLOT)


def test_other_request_field_is_added_to_dict_data() -> None:
    from idempotency_django.testing import _another_request

    assert _another_request({"a": 1}) == {"a": 1, OTHER_REQUEST_FIELD: "another request"}
    assert _another_request(None) == {OTHER_REQUEST_FIELD: "another request"}
