"""The example project, end to end, in a subprocess: manage.py check, migrate,
createsuperuser, then a real ``runserver`` (or the README's gunicorn recipe) driven
over HTTP with urllib; and ``manage.py demo``, which does all of that in one command.

The example has its own settings, so it cannot run inside this suite's Django
(tests/settings.py); everything here talks to 127.0.0.1 only.

A duplicate "sent while the first request runs" is sent while the first is held at
the example's EXAMPLE_BOOKING_GATE (``held_at_the_gate``), never within a delay that a
loaded machine could outlast: the first goes on only once the duplicate is answered.

The ``curl`` blocks in example_project/README.md and docs/*.md make the same
requests as these tests (create, replay, reuse 409, in progress 409, missing slot
400, list, PATCH, DELETE, the plain view, a webhook delivery twice): keep them in step.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.cookiejar
import importlib.util
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from base64 import b64decode, b64encode
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import servers

REPO_ROOT = Path(__file__).resolve().parent.parent
MANAGE = REPO_ROOT / "example_project" / "manage.py"
PASSWORD = "password"
BASIC = "Basic " + b64encode(f"alice:{PASSWORD}".encode()).decode()
BOOKING = {"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"}
GUNICORN = [sys.executable, "-m", "gunicorn"]
#: A Redis database of its own: the store tests use (and flush) 15.
EXAMPLE_REDIS_URL = os.environ.get("TESTS_EXAMPLE_REDIS_URL", "redis://127.0.0.1:6379/14")


def example_env(tmp_dir: Path, **extra: str) -> dict[str, str]:
    """The example's environment: this test's SQLite file and booking gate, and ``extra``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("EXAMPLE_")
        and name not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL"}
    }
    env["DATABASE_URL"] = f"sqlite:///{tmp_dir / 'example.sqlite3'}"
    env["EXAMPLE_BOOKING_GATE"] = str(booking_gate(tmp_dir))
    env["EXAMPLE_LOG_LEVEL"] = "DEBUG"  # each reservation as it is made: reserved_count()
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def gunicorn_recipe() -> list[str]:
    """The gunicorn command example_project/README.md gives, as the tests run it."""
    readme = (REPO_ROOT / "example_project" / "README.md").read_text()
    (line,) = re.findall(r"^gunicorn .+$", readme, flags=re.MULTILINE)
    return [*GUNICORN, *shlex.split(line)[1:]]


def booking_gate(tmp_dir: Path) -> Path:
    """The server's EXAMPLE_BOOKING_GATE: creating a booking waits until this file exists."""
    return tmp_dir / "booking-gate"


@contextlib.contextmanager
def example_server(tmp_dir: Path, *, server: str = "runserver", **extra_env: str) -> Iterator[str]:
    """Migrate a fresh SQLite database, create alice, serve; yields the base URL.

    ``server`` is "runserver" (threaded) or "gunicorn" (the README's recipe).
    """
    env = example_env(tmp_dir, **extra_env)
    for args in (
        ("check",),
        ("migrate", "--noinput"),
        ("createsuperuser", "--noinput", "--username", "alice", "--email", "alice@example.com"),
    ):
        done = manage({**env, "DJANGO_SUPERUSER_PASSWORD": PASSWORD}, *args)
        assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stderr}"
    port = servers.free_port()
    if server == "gunicorn":
        command = [
            *gunicorn_recipe(),
            "--bind",
            f"127.0.0.1:{port}",
            "--control-socket",
            str(tmp_dir / "gunicorn.ctl"),
        ]
    else:
        command = [sys.executable, str(MANAGE), "runserver", "--noreload", f"127.0.0.1:{port}"]
    with serving(command, env, tmp_dir, port) as base:
        yield base


@contextlib.contextmanager
def serving(command: list[str], env: dict[str, str], tmp_dir: Path, port: int) -> Iterator[str]:
    """Run ``command`` (logging to tmp_dir/server.log) until it listens on ``port``.

    Its booking gate is open: held_at_the_gate closes it for a while.
    """
    booking_gate(tmp_dir).touch()
    log = (tmp_dir / "server.log").open("w")
    process = subprocess.Popen(
        command,
        env=env,
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        # Any HTTP answer: a gunicorn master accepts connections before a worker serves them.
        servers.wait_until(
            lambda: servers.status(f"{base}/api/bookings/") is not None,
            process,
            what="the example server",
            log=tmp_dir / "server.log",
        )
        yield base
    finally:
        servers.stop(process)
        log.close()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):  # type: ignore[no-untyped-def]
        return json.loads(self.body)

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotency-replayed") == "true"


def call(
    base: str,
    method: str,
    path: str,
    payload: object | None = None,
    *,
    key: str | None = None,
    location: str | None = "portland",
    basic: bool = True,
    opener: urllib.request.OpenerDirector | None = None,
    **headers: str,
) -> Reply:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if basic:
        request.add_header("Authorization", BASIC)
    if key is not None:
        request.add_header("Idempotency-Key", key)
    if location is not None:
        request.add_header("X-Location-Id", location)
    for name, value in headers.items():
        request.add_header(name.replace("_", "-"), value)
    open_url = opener.open if opener is not None else urllib.request.urlopen
    try:
        with open_url(request, timeout=30) as response:
            return Reply(response.status, _lower(response.headers), response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, _lower(error.headers), error.read())


def _lower(headers: object) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in headers.items()}  # type: ignore[attr-defined]


def session_login(base: str) -> tuple[urllib.request.OpenerDirector, http.cookiejar.CookieJar]:
    """Log in through /admin/login/ like a browser: a CSRF cookie, then the form."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(base + "/admin/login/?next=/", timeout=30).read()
    form = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": cookie(jar, "csrftoken"),
            "username": "alice",
            "password": PASSWORD,
            "next": "/",
        }
    ).encode()
    with opener.open(base + "/admin/login/?next=/", data=form, timeout=30) as page:
        assert page.url.rstrip("/") == base, "the login did not redirect to the booking page"
    return opener, jar


def cookie(jar: http.cookiejar.CookieJar, name: str) -> str:
    return next(c.value for c in jar if c.name == name and c.value is not None)


def reserved_count(tmp_dir: Path) -> int:
    """How many keys the server has claimed so far (its DEBUG line per reservation)."""
    log = tmp_dir / "server.log"
    return log.read_text().count("event=reserved") if log.exists() else 0


def wait_until_reserved(tmp_dir: Path, more_than: int) -> None:
    """Until the server claimed another key (it logs the claim once it is stored)."""
    deadline = time.monotonic() + 30
    while reserved_count(tmp_dir) <= more_than:
        assert time.monotonic() < deadline, "the first request never claimed its key"
        time.sleep(0.02)


@contextlib.contextmanager
def gate_closed(tmp_dir: Path) -> Iterator[None]:
    """During the block, a booking being created waits at the server's gate."""
    gate = booking_gate(tmp_dir)
    gate.unlink()
    try:
        yield
    finally:
        gate.touch()


@contextlib.contextmanager
def held_at_the_gate(tmp_dir: Path, first: Callable[[], object]) -> Iterator[None]:
    """Send ``first`` (a booking) from a thread and hold it in progress for the block.

    The block starts once the server has claimed the key: whatever it sends finds
    that key in progress, however slow the machine. Then the gate opens and
    ``first`` finishes.
    """
    thread = threading.Thread(target=first)
    try:
        with gate_closed(tmp_dir):
            before = reserved_count(tmp_dir)
            thread.start()
            wait_until_reserved(tmp_dir, before)
            yield
    finally:
        thread.join()


def book_with_a_concurrent_duplicate(base: str, tmp_dir: Path, key: str) -> tuple[Reply, Reply]:
    """A booking, and the same request sent while it runs: (the first's reply, the duplicate's)."""
    replies: list[Reply] = []
    with held_at_the_gate(
        tmp_dir, lambda: replies.append(call(base, "POST", "/api/bookings/", BOOKING, key=key))
    ):
        try:
            duplicate = call(base, "POST", "/api/bookings/", BOOKING, key=key)
        except TimeoutError:
            pytest.fail("the duplicate waited for the first request: served one at a time")
    return replies[0], duplicate


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("example")


@pytest.fixture(scope="module")
def server(server_dir: Path) -> Iterator[str]:
    with example_server(server_dir) as base:
        yield base


def test_create_replay_and_reuse(server: str) -> None:
    first = call(server, "POST", "/api/bookings/", BOOKING, key="booking-8891")
    assert first.status == 201, first.body
    created = first.json()
    assert set(created) == {"id", "slot", "customer", "location"}
    assert created["slot"] == "2026-07-30T09:00:00Z"
    assert created["customer"] == "Dana Whitfield"
    assert created["location"] == "portland"
    assert not first.replayed

    again = call(server, "POST", "/api/bookings/", BOOKING, key="booking-8891")
    assert again.status == 201
    assert again.replayed
    assert again.body == first.body

    moved = {**BOOKING, "slot": "2026-07-31T09:00:00Z"}
    reused = call(server, "POST", "/api/bookings/", moved, key="booking-8891")
    assert reused.status == 409
    assert reused.headers["content-type"] == "application/problem+json"
    assert reused.json()["code"] == "idempotency_key_reused"

    listed = call(server, "GET", "/api/bookings/")
    assert [b["id"] for b in listed.json()].count(created["id"]) == 1


def test_the_ninja_operation_runs_once_after_ninjas_auth(server: str, server_dir: Path) -> None:
    """/ninja/bookings (django-ninja, HTTP Basic checked by ninja): in progress, then a replay."""
    payload = {**BOOKING, "slot": "2026-08-01T09:00:00Z"}
    replies: list[Reply] = []
    with held_at_the_gate(
        server_dir,
        lambda: replies.append(call(server, "POST", "/ninja/bookings", payload, key="ninja-7001")),
    ):
        duplicate = call(server, "POST", "/ninja/bookings", payload, key="ninja-7001")
    assert duplicate.status == 409
    assert duplicate.json()["code"] == "idempotency_key_in_progress"
    assert replies[0].status == 201, replies[0].body
    created = replies[0].json()
    assert created["location"] == "portland"
    again = call(server, "POST", "/ninja/bookings", payload, key="ninja-7001")
    assert again.replayed
    assert again.body == replies[0].body
    # No credentials: ninja's session auth (django_auth, tried after Basic) refuses it.
    refused = call(server, "POST", "/ninja/bookings", payload, key="ninja-7002", basic=False)
    assert refused.status == 403
    assert refused.json() == {"detail": "CSRF check Failed"}
    listed = call(server, "GET", "/api/bookings/")
    assert [b["id"] for b in listed.json()].count(created["id"]) == 1


def test_concurrent_duplicate_is_in_progress_then_replays(server: str, server_dir: Path) -> None:
    payload = {**BOOKING, "slot": "2026-07-30T10:00:00Z"}
    replies: list[Reply] = []

    def post() -> None:
        replies.append(call(server, "POST", "/api/bookings/", payload, key="booking-8892"))

    with held_at_the_gate(server_dir, post):  # the first claimed its key and waits
        post()  # the duplicate
    by_status = {reply.status: reply for reply in replies}
    assert sorted(by_status) == [201, 409]
    assert by_status[409].json()["code"] == "idempotency_key_in_progress"
    assert by_status[409].headers["retry-after"] == "1"
    retried = call(server, "POST", "/api/bookings/", payload, key="booking-8892")
    assert retried.status == 201 and retried.replayed
    assert retried.json()["id"] == by_status[201].json()["id"]


def test_missing_slot_is_400_and_not_kept(server: str) -> None:
    bad = call(server, "POST", "/api/bookings/", {"customer": "Dana Whitfield"}, key="booking-8893")
    assert bad.status == 400
    assert "slot" in bad.json()
    # Nothing was kept for the 400, so the same key with the fixed body runs.
    fixed = call(server, "POST", "/api/bookings/", BOOKING, key="booking-8893")
    assert fixed.status == 201 and not fixed.replayed


def test_list_is_per_location(server: str) -> None:
    made = call(server, "POST", "/api/bookings/", BOOKING, key="lisbon-1", location="lisbon")
    assert made.status == 201
    lisbon = call(server, "GET", "/api/bookings/", location="lisbon").json()
    assert [b["id"] for b in lisbon] == [made.json()["id"]]
    portland = call(server, "GET", "/api/bookings/", location="portland").json()
    assert made.json()["id"] not in [b["id"] for b in portland]


def test_patch_and_delete_are_idempotent(server: str) -> None:
    # The booking of booking-8891 (created, or replayed if test_create... ran first).
    booking = call(server, "POST", "/api/bookings/", BOOKING, key="booking-8891").json()
    path = f"/api/bookings/{booking['id']}/"
    change = {"slot": "2026-07-30T11:00:00Z"}
    patched = call(server, "PATCH", path, change, key="booking-8891-move")
    assert patched.status == 200 and patched.json()["slot"] == "2026-07-30T11:00:00Z"
    again = call(server, "PATCH", path, change, key="booking-8891-move")
    assert again.status == 200 and again.replayed and again.body == patched.body

    deleted = call(server, "DELETE", path, key="booking-8891-cancel")
    assert deleted.status == 204
    redeleted = call(server, "DELETE", path, key="booking-8891-cancel")
    assert redeleted.status == 204 and redeleted.replayed  # not 404
    assert call(server, "DELETE", path, key="booking-8891-cancel-2").status == 404


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_a_multipart_retry_from_curl_replays(server: str, tmp_path: Path) -> None:
    """curl -F picks a new boundary for every request: the retry is the same form."""
    ticket = tmp_path / "ticket.txt"
    ticket.write_bytes(b"seat 12A\r\n")

    def curl_form(slot: str) -> tuple[str, str]:
        command = ["curl", "-sS", "-i", "-v", "-X", "POST", f"{server}/api/bookings/"]
        command += ["-u", f"alice:{PASSWORD}", "-H", "Idempotency-Key: mp-1"]
        command += ["-F", f"slot={slot}", "-F", "customer=Dana"]
        command += ["-F", f"ticket=@{ticket};type=text/plain"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
        boundary = re.search(
            r"^> Content-Type: multipart/form-data; boundary=(\S+)", done.stderr, re.M
        )
        assert boundary, done.stderr
        status = done.stdout.split(" ", 2)[1]
        replayed = "Idempotency-Replayed: true" in done.stdout
        return boundary[1], status + (" replayed" if replayed else "")

    first_boundary, first = curl_form("2026-08-01T09:00:00Z")
    retry_boundary, retry = curl_form("2026-08-01T09:00:00Z")
    _, changed = curl_form("2026-08-02T09:00:00Z")
    assert first_boundary != retry_boundary
    assert (first, retry, changed) == ("201", "201 replayed", "409")


def test_plain_view_with_session_and_csrf(server: str) -> None:
    opener, jar = session_login(server)
    csrf = cookie(jar, "csrftoken")
    payload = {**BOOKING, "slot": "2026-07-30T12:00:00Z"}
    first = call(
        server, "POST", "/plain/bookings/", payload, key="plain-1", basic=False, opener=opener,
        X_CSRFToken=csrf,
    )  # fmt: skip
    assert first.status == 201, first.body
    assert first.json()["slot"] == "2026-07-30T12:00:00Z"
    again = call(
        server, "POST", "/plain/bookings/", payload, key="plain-1", basic=False, opener=opener,
        X_CSRFToken=csrf,
    )  # fmt: skip
    assert again.status == 201 and again.replayed and again.body == first.body
    no_csrf = call(server, "POST", "/plain/bookings/", payload, key="plain-2", basic=False,
                   opener=opener)  # fmt: skip
    assert no_csrf.status == 403
    missing = call(
        server, "POST", "/plain/bookings/", {"customer": "x"}, key="plain-3", basic=False,
        opener=opener, X_CSRFToken=csrf,
    )  # fmt: skip
    assert missing.status == 400


EVENT = {"type": "booking.paid", "booking": 1}
#: The example's default EXAMPLE_WEBHOOK_SECRET, as docs/webhooks.md's curl signs with it.
WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def deliver(server: str, path: str, **headers: Any) -> Reply:
    return call(server, "POST", path, EVENT, basic=False, location=None, **headers)


def test_webhook_by_idempotency_key_then_duplicate(server: str) -> None:
    first = deliver(server, "/hooks/trg_9f8e7d6c/", Idempotency_Key="evt-2KWPBgLlAfxd")
    assert first.status == 202 and first.json()["status"] == "accepted", first.body
    duplicate = deliver(server, "/hooks/trg_9f8e7d6c/", Idempotency_Key="evt-2KWPBgLlAfxd")
    assert duplicate.status == 202 and duplicate.json() == {"status": "duplicate"}
    other = deliver(server, "/hooks/trg_9f8e7d6c/", Idempotency_Key="evt-other")
    assert other.json()["status"] == "accepted"
    assert other.json()["run_id"] != first.json()["run_id"]


def test_webhook_without_a_key_is_deduplicated_by_the_fallback(server: str) -> None:
    """No Idempotency-Key (a webhook-id is not this receiver's identity): the trigger
    token and the body, in a time bucket. Another token is another namespace."""
    first = deliver(server, "/hooks/trg_fallback/", webhook_id="ignored-1")
    assert first.status == 202 and first.json()["status"] == "accepted", first.body
    again = deliver(server, "/hooks/trg_fallback/", webhook_id="ignored-2")
    assert again.status == 202 and again.json() == {"status": "duplicate"}
    elsewhere = deliver(server, "/hooks/trg_other/")
    assert elsewhere.json()["status"] == "accepted"


def standard_headers(msg_id: str, secret: str = WEBHOOK_SECRET) -> dict[str, str]:
    timestamp = str(int(time.time()))
    signed = f"{msg_id}.{timestamp}.{json.dumps(EVENT)}".encode()
    key = b64decode(secret.removeprefix("whsec_"))
    signature = b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {
        "webhook_id": msg_id,
        "webhook_timestamp": timestamp,
        "webhook_signature": f"v1,{signature}",
    }


def test_standard_webhook_refuses_a_forgery_before_deduplicating(server: str) -> None:
    path = "/standard-hooks/trg_9f8e7d6c/"
    forged = standard_headers("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", secret="whsec_" + "A" * 32)
    assert deliver(server, path, **forged).status == 401
    assert deliver(server, path, webhook_id="msg_2KWPBgLlAfxdpx2AI54pPJ85f4W").status == 401
    # The forgeries claimed nothing: the genuine delivery of that id runs, once.
    genuine = standard_headers("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
    first = deliver(server, path, **genuine)
    assert first.status == 202 and first.json()["status"] == "accepted", first.body
    duplicate = deliver(server, path, **genuine)
    assert duplicate.status == 202 and duplicate.json() == {"status": "duplicate"}


def test_served_by_the_gunicorn_recipe(tmp_path: Path) -> None:
    """Under the README's recipe a concurrent duplicate is answered 409 in progress:
    with one sync worker it would wait in the queue and be replayed instead."""
    if importlib.util.find_spec("gunicorn") is None:
        pytest.skip("gunicorn is not installed (pip install -e '.[example]')")
    assert {"--workers", "--threads"} & set(gunicorn_recipe()), "the recipe serves one at a time"
    with example_server(tmp_path, server="gunicorn") as base:
        first, busy = book_with_a_concurrent_duplicate(base, tmp_path, "gunicorn-1")
        assert first.status == 201, first.body
        assert busy.status == 409, busy.body
        assert busy.json()["code"] == "idempotency_key_in_progress"
        again = call(base, "POST", "/api/bookings/", BOOKING, key="gunicorn-1")
        assert again.status == 201 and again.replayed and again.body == first.body


def test_demo_command(tmp_path: Path) -> None:
    """``manage.py demo`` alone: migrate, the demo user, a server with a visible
    in-progress window. Run twice: the second run finds everything as the first left it.

    The demo's window is its own delay (no EXAMPLE_BOOKING_DELAY_MS: the default); the
    duplicate is sent within it while the first request is also held at the gate.
    """
    env = example_env(tmp_path)
    booked: list[int] = []
    for run in ("first", "second"):
        port = servers.free_port()
        started = time.monotonic()
        command = [sys.executable, str(MANAGE), "demo", f"127.0.0.1:{port}"]
        with serving(command, env, tmp_path, port) as base:
            print(f"demo ({run} run) listening after {time.monotonic() - started:.1f} s")
            printed = (tmp_path / "server.log").read_text()
            assert f"Demo user: alice / {PASSWORD}" in printed
            assert ("(created)" if run == "first" else "(already there)") in printed
            assert f"Booking page: {base}/" in printed
            assert "Creating a booking takes 1500 ms" in printed  # the window people see

            opener, _ = session_login(base)  # the printed name and password log in
            with opener.open(base + "/", timeout=30) as page:
                assert page.status == 200 and b"booking-form" in page.read()

            first, busy = book_with_a_concurrent_duplicate(base, tmp_path, f"demo-{run}")
            assert first.status == 201, first.body
            assert busy.status == 409 and busy.json()["code"] == "idempotency_key_in_progress"
            replay = call(base, "POST", "/api/bookings/", BOOKING, key=f"demo-{run}")
            assert replay.status == 201 and replay.replayed and replay.body == first.body
            booked.append(first.json()["id"])
            listed = [b["id"] for b in call(base, "GET", "/api/bookings/").json()]
            assert listed == booked  # one booking per run, the first run's kept


def redis_unreachable() -> str | None:
    try:
        import redis
    except ImportError:
        return "the redis package is not installed"
    try:
        redis.Redis.from_url(EXAMPLE_REDIS_URL, socket_connect_timeout=0.5).ping()
    except Exception as exc:
        return f"Redis is not reachable at {EXAMPLE_REDIS_URL} ({type(exc).__name__})"
    return None


def test_redis_backend(tmp_path: Path) -> None:
    reason = redis_unreachable()
    if reason:
        pytest.skip(reason)
    redis_env = {"REDIS_URL": EXAMPLE_REDIS_URL, "EXAMPLE_IDEMPOTENCY_BACKEND": "redis"}
    key = f"redis-{uuid.uuid4()}"  # the database is shared between runs
    with example_server(tmp_path, **redis_env) as base:
        first, busy = book_with_a_concurrent_duplicate(base, tmp_path, key)
        assert busy.status == 409 and busy.json()["code"] == "idempotency_key_in_progress"
        assert first.status == 201
        again = call(base, "POST", "/api/bookings/", BOOKING, key=key)
        assert again.status == 201 and again.replayed and again.body == first.body
        assert len(call(base, "GET", "/api/bookings/").json()) == 1
    assert not list(records_in_sqlite(tmp_path))  # the records went to Redis


def records_in_sqlite(tmp_path: Path) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(tmp_path / "example.sqlite3")) as db:
        return db.execute("SELECT key FROM idempotency_django_idempotencyrecord").fetchall()
