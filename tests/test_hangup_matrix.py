"""Exactly once when the client hangs up: every server, store and kind of view.

Each test starts gunicorn (WSGI), uvicorn or daphne (ASGI) on the test database and
talks to it over a raw socket that really closes: no part of the race is mocked. They
cover what tests/hangup/ does not: a hang-up while the body is still being sent, the
django-ninja integration (sync, ``atomic=True`` and async operations), the Redis store,
and ``ATOMIC_REQUESTS`` off as well as on.
"""

from __future__ import annotations

import re
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
from tests.servers import running
from tests.testapp.models import Booking

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

SETTINGS = {"DJANGO_SETTINGS_MODULE": "tests.hangup_matrix.settings"}
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
    browser: Browser,
    path: str,
    key: str | None,
    content_type: str,
    body: bytes,
    sent: int,
    **extra: str,
) -> None:
    """Send the head of a form POST announcing all of ``body``, then only ``sent`` bytes
    of it, and close the connection: a client whose network dropped mid-upload."""
    headers = {
        "Host": f"127.0.0.1:{browser.port}",
        "Content-Type": content_type,
        "Content-Length": str(len(body)),
        **browser._headers({**({"Idempotency-Key": key} if key else {}), **extra}),
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


@pytest.mark.parametrize("size", FORMS)
@pytest.mark.parametrize("receiver", ["fallback", "Webhook-Id"])
@pytest.mark.parametrize("server", SERVERS)
def test_a_delivery_cut_short_by_a_hang_up_runs_nothing_and_the_retry_runs_once(
    server: str, receiver: str, size: str, alice: User
) -> None:
    """The same for a webhook receiver: a sender that hangs up mid-body never delivered.

    Under gunicorn this failed: the receiver's fallback identity hashed what arrived
    of the body, and a receiver identified by ``Webhook-Id`` read nothing before its
    claim; either way the view booked slot ``2026`` from the cut body (the small
    form), the delivery was accepted, and the sender's retry got ``202 duplicate``
    (with the id) or booked a second time (the fallback): the event the sender sent
    was never booked as sent.
    """
    content_type, body, sent = FORMS[size]
    path = "/form-hooks/trg_cut/" if receiver == "fallback" else "/form-hooks/with-id/trg_cut/"
    delivery = {"Webhook-Id": "delivery-cut-1"}
    with serve(server, **SETTINGS) as port:
        browser = Browser(port).login("alice", "alice-password")
        send_part_of_the_body(browser, path, None, content_type, body, sent, **delivery)
        time.sleep(1)
        retry = browser.request("POST", path, body, **{"Content-Type": content_type, **delivery})
        again = browser.request("POST", path, body, **{"Content-Type": content_type, **delivery})
    booked = list(Booking.objects.values_list("customer", "slot"))
    assert (retry.status, booked) == (201, [("Alice Smith", "2026-07-30T09:00")]), retry.body
    assert (again.status, again.json()) == (202, {"status": "duplicate"})


def test_a_drf_upload_cut_short_books_nothing_and_the_retry_books_once(alice: User) -> None:
    """The same through DRF's parsers (``@idempotent`` below ``@api_view``), under gunicorn:
    a multipart upload cut short. Before ``BodyCutShort`` DRF parsed what arrived, the
    handler booked, its 201 was stored, and the whole request's retry got ``409``."""
    content_type, body, sent = FORMS["multipart upload"]
    with serve("gunicorn", **SETTINGS) as port:
        browser = Browser(port).login("alice", "alice-password")
        send_part_of_the_body(browser, "/keyed/drf/", "drf-upload", content_type, body, sent)
        time.sleep(1)
        retry = browser.request(
            "POST", "/keyed/drf/", body,
            **{"Content-Type": content_type, "Idempotency-Key": "drf-upload"},
        )  # fmt: skip
    assert (retry.status, retry.replayed, runs("drf-upload")) == (201, False, 1), retry.body


# -- a hang-up mid-view, every kind of view, both stores, ATOMIC_REQUESTS on and off -----

#: Path and whether it is a ninja operation (a bearer token). Each run books one row
#: named after its key.
VIEWS = {
    "sync view": ("/keyed/sync/", False),
    "async view": ("/keyed/async/", False),
    "DRF view": ("/keyed/drf/", False),
    "sync view, TemplateResponse": ("/keyed/template/", False),
    "async @idempotent view, TemplateResponse": ("/keyed/async-template/", False),
    "ninja sync operation": ("/ninja/bookings", True),
    "ninja atomic=True operation": ("/ninja/atomic-bookings", True),
    "ninja async operation": ("/ninja/async-bookings", True),
}


def views_for(atomic_requests: bool) -> dict[str, tuple[str, bool]]:
    # Django refuses ATOMIC_REQUESTS for an async view; a ninja API whose path has only
    # async operations is one (non_atomic_requests cannot be put on ninja's view).
    return {
        name: view
        for name, view in VIEWS.items()
        if not (atomic_requests and name == "ninja async operation")
    }


def retry_until_settled(
    browser: Browser, path: str, key: str, headers: dict[str, str], first_after: float
) -> Answer:
    """Retry as the docs tell clients to: with the same key, again after ``Retry-After``
    while in progress (409) or on a 5xx (the store, or SQLite's write lock, busy; a
    server's own timeout)."""
    time.sleep(first_after)
    deadline = time.monotonic() + 40
    while True:
        response = browser.post(path, key, {"slot": key}, **headers)
        if (response.status != 409 and response.status < 500) or time.monotonic() > deadline:
            return response
        time.sleep(float(response.headers.get("retry-after", 1)))


def outcome(response: Answer) -> str:
    if response.status == 201:
        return "replayed 201" if response.replayed else "201"
    return f"{response.status}: {response.body[:300].decode(errors='replace')}"


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower())


def runs(key: str) -> int:
    return Booking.objects.filter(customer=key).count()


def settle(got: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """Whether the retry's 201 is a replay or its own says nothing about "once": a server
    whose threads are all busy may take the retry before the request that hung up (which
    then finds the key taken), and on SQLite a first request that waited past the busy
    timeout for the one write lock wrote nothing and freed its key. The count of runs of
    each key is what must be 1; a retry that ends in anything but a 201 fails."""
    return {name: ({"201": "replayed 201"}.get(o, o), n) for name, (o, n) in got.items()}


@pytest.mark.parametrize("atomic_requests", [False, True], ids=["autocommit", "ATOMIC_REQUESTS"])
@pytest.mark.parametrize("store", ["database", "redis"])
@pytest.mark.parametrize("server", SERVERS)
def test_a_hang_up_mid_view_runs_once_whenever_the_retry_comes(
    server: str, store: str, atomic_requests: bool, alice: User
) -> None:
    """Every kind of view hangs up twice, with two keys: one retried while the first
    request still runs (it must wait its turn: 409, or blocked on the uncommitted claim,
    never a second run), one retried after it ended (a replay). One run per key: never
    two (work done and key freed), never none with a 201 (an answer kept for work that
    rolled back), and no key still held 40 s later."""
    environment = {**SETTINGS, "HANGUP_ATOMIC": "1" if atomic_requests else "0"}
    if store == "redis":
        skip_without_redis()
        raw_client().flushdb()
        environment |= {"HANGUP_STORE": "redis", "HANGUP_REDIS_URL": REDIS_URL}
    bearer = {"Authorization": f"Bearer {Token.objects.create(user=alice).key}"}
    views = views_for(atomic_requests)
    # (view, key, seconds from the hang-up to the first retry)
    cases = [
        (name, f"{when}-{slug(name)}", after)
        for name in views
        for when, after in (("early", 0.3), ("late", RETRY_AFTER_SECONDS))
    ]

    def hang_up_then_retry(name: str, key: str, after: float) -> Answer:
        path, ninja = views[name]
        headers = bearer if ninja else {}
        url = f"{path}?delay={VIEW_SECONDS}"
        browser.hang_up(url, key=key, payload={"slot": key}, **headers)  # type: ignore[arg-type]
        return retry_until_settled(browser, url, key, headers, after)

    try:
        with serve(server, **environment) as port:
            browser = Browser(port).login("alice", "alice-password")
            answers = in_parallel(*(lambda case=case: hang_up_then_retry(*case) for case in cases))
    finally:
        if store == "redis":
            raw_client().flushdb()
    got = {
        key: (outcome(answer), runs(key))
        for (_, key, _), answer in zip(cases, answers, strict=True)
    }
    got = settle(got)
    assert got == {key: ("replayed 201", 1) for _, key, _ in cases}


# -- the server gives up on the application: daphne's timeouts ------------------------


def daphne_with_timeouts(port: int) -> list[str]:
    """daphne answering 503 itself after 1 s (``--http-timeout``), and cancelling the
    application each second from 1 s after the client is gone
    (``--application-close-timeout``): what a proxy's timeout does to a request."""
    return [
        "daphne", "-b", "127.0.0.1", "-p", str(port),
        "--http-timeout", "1", "--application-close-timeout", "1",
        "tests.hangup.app:asgi",
    ]  # fmt: skip


@pytest.mark.parametrize("atomic_requests", [False, True], ids=["autocommit", "ATOMIC_REQUESTS"])
def test_a_view_daphne_gives_up_on_runs_once_and_is_replayed(
    atomic_requests: bool, alice: User
) -> None:
    """daphne answers 503 after 1 s and then cancels the application again and again
    while each 4 s view still runs. Every view runs to its end once, its answer is
    kept, and the client's retry (after daphne's 503) gets it replayed."""
    environment = {**SETTINGS, "HANGUP_ATOMIC": "1" if atomic_requests else "0"}
    bearer = {"Authorization": f"Bearer {Token.objects.create(user=alice).key}"}
    views = views_for(atomic_requests)
    with running(
        daphne_with_timeouts, environment, what="daphne", ready_path="/accounts/login/"
    ) as port:
        browser = Browser(port).login("alice", "alice-password")

        def post_then_retry(name: str) -> tuple[int, Answer]:
            path, ninja = views[name]
            headers = bearer if ninja else {}
            url, key = f"{path}?delay=4", f"gave-up-{slug(name)}"
            first = browser.post(url, key, {"slot": key}, **headers)
            return first.status, retry_until_settled(browser, url, key, headers, 0)

        answers = in_parallel(*(lambda name=name: post_then_retry(name) for name in views))
    got = {
        name: (first, outcome(retry), runs(f"gave-up-{slug(name)}"))
        for name, (first, retry) in zip(views, answers, strict=True)
    }
    if connection.vendor == "sqlite":
        # A retry waiting for SQLite's write lock past 1 s gets daphne's 503 too; a first
        # request that waited past the busy timeout booked nothing: see settle().
        got = {name: (503, {"201": "replayed 201"}.get(o, o), n) for name, (_, o, n) in got.items()}
    assert got == {name: (503, "replayed 201", 1) for name in views}
