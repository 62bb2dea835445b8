"""An adversarial review of "exactly once when the client hangs up", on real servers.

Each test starts gunicorn (WSGI), uvicorn or daphne (ASGI) on the test database and
talks to it over a raw socket that really closes: no part of the race is mocked. They
cover what tests/hangup/ does not: a hang-up while the body is still being sent, the
django-ninja integration (sync, ``atomic=True`` and async operations), the Redis store,
and ``ATOMIC_REQUESTS`` off as well as on.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from rest_framework.authtoken.models import Token

from tests.hangup.servers import Answer, Browser, serve
from tests.redis_helpers import REDIS_URL, raw_client, skip_without_redis
from tests.testapp.models import Booking

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

SETTINGS = {"DJANGO_SETTINGS_MODULE": "tests.review_hangups.settings"}
SERVERS = ["gunicorn", "uvicorn", "daphne"]

#: The view takes this long; the client hangs up after 0.3 s and retries this much later.
VIEW_SECONDS = 1.5
RETRY_AFTER_SECONDS = 2.5


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user("alice", password="alice-password")


def in_parallel(*calls: Any) -> list[Any]:
    with ThreadPoolExecutor(len(calls)) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


# -- a hang-up while the body is still on its way ------------------------------------

BOUNDARY = "review-hangups-boundary"


def multipart(fields: dict[str, str], upload: bytes) -> bytes:
    """A multipart form: ``fields``, then a file larger than DATA_UPLOAD_MAX_MEMORY_SIZE."""
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    parts.append(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="ticket"; filename="t.pdf"\r\n'
        "Content-Type: application/pdf\r\n\r\n".encode()
        + upload
        + b"\r\n"
    )
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


#: A small urlencoded form (read whole as ``request.body``) and a multipart upload over
#: DATA_UPLOAD_MAX_MEMORY_SIZE (copied to a file), each with the bytes sent of it.
FORMS = {
    "urlencoded": (
        "application/x-www-form-urlencoded",
        b"customer=Alice+Smith&slot=2026-07-30T09%3A00",
        30,
    ),
    "multipart upload": (
        f"multipart/form-data; boundary={BOUNDARY}",
        multipart({"customer": "Alice Smith", "slot": "2026-07-30T09:00"}, b"%PDF" * 800_000),
        2_000_000,
    ),
}


def send_part_of_the_body(
    browser: Browser, path: str, key: str, content_type: str, body: bytes, sent: int
) -> None:
    """Send the head of a form POST announcing all of ``body``, then only ``sent`` bytes
    of it, and close the connection: a client whose network dropped mid-upload."""
    headers = {
        "Host": f"127.0.0.1:{browser.port}",
        "Content-Type": content_type,
        "Content-Length": str(len(body)),
        **browser._headers({"Idempotency-Key": key}),
    }
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection(("127.0.0.1", browser.port)) as sock:
        sock.sendall(head.encode() + b"\r\n" + body[:sent])
        time.sleep(0.3)
        sock.shutdown(socket.SHUT_RDWR)


@pytest.mark.parametrize("size", FORMS)
@pytest.mark.parametrize("server", SERVERS)
def test_a_body_cut_short_by_a_hang_up_books_nothing_and_the_retry_books_once(
    server: str, size: str, alice: User
) -> None:
    """The client announces a form and hangs up before the end of its body. That request
    was never received: nothing may run on what arrived of it, and the client's retry
    (the same request, whole) must book once, with what the client sent.

    Under gunicorn this failed before ``BodyCutShort``: gunicorn (and Django's
    ``LimitedStream``) hand a partial body on without an error, so the library
    fingerprinted it, the view booked slot ``2026`` (the small form cut after 30
    bytes), the answer was stored, and the retry got ``409 idempotency_key_reused``.
    """
    content_type, body, sent = FORMS[size]
    with serve(server, **SETTINGS) as port:
        browser = Browser(port).login("alice", "alice-password")
        send_part_of_the_body(browser, "/form/", "form-1", content_type, body, sent)
        time.sleep(1)
        retry = browser.request(
            "POST", "/form/", body, **{"Content-Type": content_type, "Idempotency-Key": "form-1"}
        )
    booked = list(Booking.objects.values_list("customer", "slot"))
    assert (retry.status, booked) == (201, [("Alice Smith", "2026-07-30T09:00")]), retry.body


# -- a hang-up mid-view, every kind of view, both stores, ATOMIC_REQUESTS on and off -----

#: Path, the slot each run books, whether it is a ninja operation (bearer token).
VIEWS = {
    "sync view": ("/sync/", "sync", False),
    "async view": ("/async/", "async", False),
    "DRF view": ("/drf/", "drf", False),
    "ninja sync operation": ("/ninja/bookings", "ninja-sync", True),
    "ninja atomic=True operation": ("/ninja/atomic-bookings", "ninja-atomic", True),
    "ninja async operation": ("/ninja/async-bookings", "ninja-async", True),
}


def views_for(atomic_requests: bool) -> dict[str, tuple[str, str, bool]]:
    # Django refuses ATOMIC_REQUESTS for an async view; a ninja API whose path has only
    # async operations is one (non_atomic_requests cannot be put on ninja's view).
    return {
        name: view
        for name, view in VIEWS.items()
        if not (atomic_requests and name == "ninja async operation")
    }


def retry_until_settled(
    browser: Browser, path: str, key: str, payload: object, headers: dict[str, str]
) -> Answer:
    """Retry as the docs tell clients to: again after ``Retry-After`` while in progress."""
    deadline = time.monotonic() + 20
    while True:
        response = browser.post(path, key, payload, **headers)
        if response.status != 409 or time.monotonic() > deadline:
            return response
        time.sleep(float(response.headers.get("retry-after", 1)))


def outcome(response: Answer) -> str:
    if response.status == 201:
        return "replayed 201" if response.replayed else "201"
    return f"{response.status}: {response.body[:300].decode(errors='replace')}"


@pytest.mark.parametrize("atomic_requests", [False, True], ids=["autocommit", "ATOMIC_REQUESTS"])
@pytest.mark.parametrize("store", ["database", "redis"])
@pytest.mark.parametrize("server", SERVERS)
def test_a_hang_up_mid_view_books_once_and_the_retry_replays(
    server: str, store: str, atomic_requests: bool, alice: User
) -> None:
    environment = {**SETTINGS, "HANGUP_ATOMIC": "1" if atomic_requests else "0"}
    if store == "redis":
        skip_without_redis()
        raw_client().flushdb()
        environment |= {"HANGUP_STORE": "redis", "HANGUP_REDIS_URL": REDIS_URL}
    bearer: dict[str, Any] = {"Authorization": f"Bearer {Token.objects.create(user=alice).key}"}
    views = views_for(atomic_requests)
    try:
        with serve(server, **environment) as port:
            browser = Browser(port).login("alice", "alice-password")
            in_parallel(
                *(
                    lambda path=path, slot=slot, ninja=ninja: browser.hang_up(
                        f"{path}?delay={VIEW_SECONDS}",
                        key=f"hang-up-{slot}",
                        payload={"slot": slot},
                        **(bearer if ninja else {}),
                    )
                    for path, slot, ninja in views.values()
                )
            )
            time.sleep(RETRY_AFTER_SECONDS)
            retries = {
                name: retry_until_settled(
                    browser,
                    f"{path}?delay={VIEW_SECONDS}",
                    f"hang-up-{slot}",
                    {"slot": slot},
                    bearer if ninja else {},
                )
                for name, (path, slot, ninja) in views.items()
            }
    finally:
        if store == "redis":
            raw_client().flushdb()
    got = {
        name: (outcome(retries[name]), Booking.objects.filter(slot=slot).count())
        for name, (_, slot, _) in views.items()
    }
    if connection.vendor == "sqlite":
        # Writers queue for SQLite's one write lock: a first request that waited past
        # the busy timeout wrote nothing, and its retry books for the first time.
        got = {name: ({"201": "replayed 201"}.get(o, o), n) for name, (o, n) in got.items()}
    assert got == {name: ("replayed 201", 1) for name in views}
