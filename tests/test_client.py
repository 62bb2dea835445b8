"""The retry client (idempotency-client, its own distribution) against idempotency-django:
the three clients (requests, httpx, async httpx) and the example project over real HTTP.

The client's own tests (idempotency-client/tests: the retry matrix, the backoff,
redirects, refused calls, docs/errors.md) run without Django. These need the server:
the example project's (tests/test_example_project.py starts it), with
tests/fault_proxy.py between client and server where a test needs a lost answer or a
gateway's 429/502.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import itertools
import json
import logging
import sqlite3
import threading
import time
import uuid
from base64 import b64encode
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import three_clients

import idempotency_client as client_module
from idempotency_client import (
    IdempotentClient,
    RequestRejected,
    RetriesExhausted,
    RetryPolicy,
)
from idempotency_django.conf import DEFAULTS
from idempotency_django.protocol import problems
from tests.docs_blocks import run_page_code
from tests.fault_proxy import DROP, FORWARD, HOLD, Answer, Step, fault_proxy
from tests.servers import free_port
from tests.test_example_project import (
    PASSWORD,
    booking_gate,
    example_server,
    held_at_the_gate,
)

# docs/clients.md's own functions (requests, then httpx), run against the example project.
client_requests = SimpleNamespace(**run_page_code("docs/clients.md", {"__name__": __name__}, 0, 2))
client_httpx = SimpleNamespace(**run_page_code("docs/clients.md", {"__name__": __name__}, 1))

ALICE = ("alice", PASSWORD)
BASIC = "Basic " + b64encode(f"alice:{PASSWORD}".encode()).decode()
STALE = "Basic " + b64encode(b"alice:stale-password").decode()

# -- the client knows the server


def test_the_client_knows_the_servers_problem_codes() -> None:
    assert client_module.KEY_IN_PROGRESS == problems.KEY_IN_PROGRESS
    assert client_module.KEY_REUSED == problems.KEY_REUSED
    assert client_module.UNAVAILABLE == problems.UNAVAILABLE
    assert client_module.PROBLEM_CONTENT_TYPE == problems.PROBLEM_CONTENT_TYPE
    assert DEFAULTS["MARKER_HEADERS"]["KEY_IGNORED"] == client_module.IGNORED_KEY_HEADER


# -- the clients, as a test drives them (idempotency-client/tests/three_clients.py) --


class Api(three_clients.Api):
    """The client's tests' driver of the three clients, signed in as alice unless told."""

    def __init__(self, kind: str, *, auth: tuple[str, str] | None = ALICE, **options: Any) -> None:
        super().__init__(kind, auth=auth, **options)


@dataclass
class Server:
    base: str
    directory: Path

    @property
    def port(self) -> int:
        port = urlsplit(self.base).port
        assert port is not None
        return port

    def bookings_at(self, slot: str) -> int:
        """Bookings for ``slot`` in the server's database, however they were made."""
        stored = slot.replace("T", " ").removesuffix("Z")
        with contextlib.closing(sqlite3.connect(self.directory / "example.sqlite3")) as db:
            query = "SELECT COUNT(*) FROM bookings_booking WHERE slot = ?"
            return int(db.execute(query, (stored,)).fetchone()[0])


_minutes = itertools.count()


def new_slot() -> str:
    """A slot no other test books, so that counting its bookings counts this test's."""
    moment = datetime(2027, 1, 1, tzinfo=UTC) + timedelta(minutes=next(_minutes))
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def booking(slot: str) -> dict[str, str]:
    return {"slot": slot, "customer": "Dana Whitfield"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("client-server")
    kind = "gunicorn" if importlib.util.find_spec("gunicorn") else "runserver"
    with example_server(directory, server=kind) as base:
        yield Server(base, directory)


@pytest.fixture(scope="module")
def storeless_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Keys are kept in a Redis that is not there: every key claim fails (503)."""
    directory = tmp_path_factory.mktemp("client-storeless-server")
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    with example_server(directory, REDIS_URL=nowhere, EXAMPLE_IDEMPOTENCY_BACKEND="redis") as base:
        yield Server(base, directory)


@pytest.fixture(params=three_clients.KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- against the example project ---------------------------------------------------


def test_books_once_then_replays(kind: str, server: Server) -> None:
    slot, key = new_slot(), f"client-{uuid.uuid4()}"
    api = Api(kind)
    url = server.base + "/api/bookings/"
    first = api.post(url, json=booking(slot), key=key, location="portland")
    assert first.status_code == 201, first.content
    assert "Idempotency-Replayed" not in first.headers
    assert first.json()["location"] == "portland"

    again = api.post(url, json=booking(slot), key=key, location="portland")
    assert again.status_code == 201
    assert again.headers["Idempotency-Replayed"] == "true"
    assert again.content == first.content
    assert server.bookings_at(slot) == 1
    assert api.sleeps == []


def test_a_key_is_made_once_per_operation(kind: str, server: Server) -> None:
    slot = new_slot()
    api = Api(kind)
    with fault_proxy(server.port, [FORWARD]) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/api/bookings/"
        for _ in range(2):
            assert api.post(url, json=booking(slot), location="portland").status_code == 201
    keys = [exchange.headers["idempotency-key"] for exchange in proxy.exchanges]
    assert len(set(keys)) == 2  # two operations, two keys...
    assert all(uuid.UUID(key).version == 4 for key in keys)  # ...made with uuid4
    assert server.bookings_at(slot) == 2
    body = proxy.exchanges[0].body
    assert body == json.dumps(booking(slot), separators=(",", ":")).encode()
    assert proxy.exchanges[0].headers["content-type"] == "application/json"


@pytest.mark.parametrize("fault", [DROP, HOLD])
def test_a_lost_answer_is_retried_with_the_same_key_and_bytes(
    kind: str, fault: str, server: Server
) -> None:
    """The server commits and answers; the client never sees the answer."""
    slot = new_slot()
    api = Api(kind, jitter=lambda: 0.5, policy=RetryPolicy(base=0.2))
    with fault_proxy(server.port, [fault, FORWARD]) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/api/bookings/"
        # HOLD: the answer never comes; the client's read timeout ends the attempt.
        response = api.post(url, json=booking(slot), location="portland", timeout=1.0)

    # The guarantee first: one booking, whatever the order the attempts reached it in.
    assert server.bookings_at(slot) == 1
    # On a loaded machine a retry can outlast its 1 s timeout too: then more attempts.
    exchanges = [(e.upstream_status, e.headers.get("idempotency-key")) for e in proxy.exchanges]
    assert response.status_code == 201
    assert response.headers.get("Idempotency-Replayed") == "true", exchanges
    lost, *retried = proxy.exchanges
    assert retried
    assert lost.upstream_status == 201  # the first attempt did the booking
    for attempt in retried:
        assert (lost.method, lost.path, lost.body) == (attempt.method, attempt.path, attempt.body)
        assert lost.headers["idempotency-key"] == attempt.headers["idempotency-key"]
    assert lost.body == json.dumps(booking(slot), separators=(",", ":")).encode()
    assert api.sleeps[0] == 0.1  # the backoff of attempt 1: 0.5 * 0.2


def test_a_gateways_429_and_502_are_retried(kind: str, server: Server) -> None:
    slot = new_slot()
    api = Api(kind, jitter=lambda: 0.5, policy=RetryPolicy(base=0.2))
    plan: list[Step] = [
        Answer(429, "Too Many Requests", {"Retry-After": "1"}),
        Answer(502, "Bad Gateway"),
        FORWARD,
    ]
    with fault_proxy(server.port, plan) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/api/bookings/"
        response = api.post(url, json=booking(slot), location="portland")
    assert response.status_code == 201
    assert "Idempotency-Replayed" not in response.headers  # only the last one got through
    assert api.sleeps == [1.0, 0.2]  # Retry-After, then the backoff of attempt 2
    assert len({(e.body, e.headers["idempotency-key"]) for e in proxy.exchanges}) == 1
    assert server.bookings_at(slot) == 1


def test_in_progress_is_waited_out_and_ends_with_the_replay(kind: str, server: Server) -> None:
    """Two workers run the same operation at once (the same key and body).

    The first is held at the server's booking gate until the second has been
    answered 409 in progress: the gate opens as the second starts its wait.
    """
    slot, key = new_slot(), f"client-{uuid.uuid4()}"
    url = server.base + "/api/bookings/"
    answers = []

    def open_the_gate_and_sleep(seconds: float) -> None:
        booking_gate(server.directory).touch()  # the second has its 409: the first goes on
        time.sleep(seconds)

    first_api, second_api = Api(kind), Api(kind, sleep=open_the_gate_and_sleep)

    def run_first() -> None:
        answers.append(first_api.post(url, json=booking(slot), key=key, location="portland"))

    with held_at_the_gate(server.directory, run_first):
        second = second_api.post(url, json=booking(slot), key=key, location="portland")

    assert second.status_code == 201
    assert second.headers["Idempotency-Replayed"] == "true"
    assert second.json() == answers[0].json()
    assert second_api.sleeps and set(second_api.sleeps) == {1.0}  # the server's Retry-After
    assert first_api.sleeps == []
    assert server.bookings_at(slot) == 1


@pytest.mark.parametrize("case", ["reused key", "invalid body", "no such booking"])
def test_a_request_that_cannot_succeed_is_not_retried(kind: str, case: str, server: Server) -> None:
    slot, key = new_slot(), f"client-{uuid.uuid4()}"
    api = Api(kind)
    url = server.base + "/api/bookings/"
    method = "POST"
    expected: tuple[int, str | None] = (409, problems.KEY_REUSED)
    if case == "reused key":
        assert api.post(url, json=booking(slot), key=key, location="p").status_code == 201
        body: dict[str, str] = booking(new_slot())
    elif case == "invalid body":
        body, expected = {"customer": "Dana Whitfield"}, (400, None)
    else:
        method, url, body, expected = "PATCH", url + "999999/", {"slot": slot}, (404, None)

    with pytest.raises(RequestRejected) as rejected:
        api.request(method, url, json=body, key=key, location="p")
    error = rejected.value
    assert (error.status, error.code) == expected
    assert error.response is not None and error.response.status_code == expected[0]
    assert error.attempts == 1 and api.sleeps == []
    assert key not in str(error) and key not in repr(error.args)


def test_a_key_that_cannot_be_claimed_is_not_retried_past_the_budget(
    kind: str, storeless_server: Server
) -> None:
    """503 idempotency_unavailable with Retry-After: 1, and 0.5 s of budget: stop at once."""
    slot = new_slot()
    api = Api(kind, policy=RetryPolicy(max_elapsed=0.5))
    with pytest.raises(RetriesExhausted) as exhausted:
        api.post(storeless_server.base + "/api/bookings/", json=booking(slot), location="p")
    error = exhausted.value
    assert (error.status, error.code, error.retry_after) == (503, problems.UNAVAILABLE, 1.0)
    assert error.attempts == 1 and api.sleeps == []
    assert "retry later with the same key" in str(error)
    assert storeless_server.bookings_at(slot) == 0


def test_401_exchanges_the_credential_once(kind: str, server: Server) -> None:
    slot, exchanges = new_slot(), []

    def exchange() -> dict[str, str]:
        exchanges.append(BASIC)
        return {"Authorization": BASIC}

    api = Api(kind, auth=None, reauthenticate=exchange)
    url = server.base + "/api/bookings/"
    stale = {"Authorization": STALE}
    response = api.post(url, json=booking(slot), headers=stale, location="p")
    assert response.status_code == 201 and exchanges == [BASIC]
    assert api.sleeps == [0.0]
    assert server.bookings_at(slot) == 1

    def exchange_for_another_stale_one() -> dict[str, str]:
        exchanges.append(STALE)
        return stale

    api = Api(kind, auth=None, reauthenticate=exchange_for_another_stale_one)
    with pytest.raises(RequestRejected) as rejected:
        api.post(url, json=booking(new_slot()), headers=stale, location="p")
    assert rejected.value.status == 401 and rejected.value.attempts == 2
    assert exchanges == [BASIC, STALE]  # once per operation, then it is for a person

    with pytest.raises(RequestRejected) as unexchanged:
        Api(kind, auth=None).post(url, json=booking(new_slot()), headers=stale, location="p")
    assert unexchanged.value.attempts == 1


def test_logs_carry_neither_the_key_nor_the_credential_nor_the_body(
    kind: str, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger: the HTTP libraries' too
    key, customer = f"secret-key-{uuid.uuid4()}", f"Customer {uuid.uuid4()}"
    slot = new_slot()
    body = {"slot": slot, "customer": customer}
    with fault_proxy(server.port, [DROP, FORWARD]) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/api/bookings/"
        api = Api(kind, auth=None, reauthenticate=lambda: {"Authorization": BASIC})
        api.post(url, json=body, key=key, headers={"Authorization": STALE}, location="p")
        with pytest.raises(RequestRejected):
            other = {**body, "slot": new_slot()}
            api.post(url, json=other, key=key, headers={"Authorization": BASIC}, location="p")

    ours = [r for r in caplog.records if r.name == "idempotency_client"]
    levels = [r.levelname for r in ours]
    assert levels == ["INFO", "INFO", "DEBUG", "WARNING"], [r.getMessage() for r in ours]
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    assert all(f"[op {digest}]" in r.getMessage() for r in ours)
    assert "409 idempotency_key_reused" in ours[-1].getMessage()

    secrets = [key, BASIC, STALE, BASIC.split()[1], STALE.split()[1], PASSWORD, customer]
    for record in caplog.records:
        text = " ".join([record.getMessage(), repr(record.args), record.exc_text or ""])
        if record.exc_info:
            text += repr(record.exc_info[1])
        for secret in secrets:
            assert secret not in text, (record.name, record.getMessage())


# -- the examples on docs/clients.md ------------------------------------------------


def test_docs_requests_example(server: Server) -> None:
    api = client_requests.bookings_api(*ALICE)
    slot = new_slot()
    made = client_requests.book(api, server.base, 8801, slot)
    assert made["slot"] == slot and made["location"] == "portland"
    assert client_requests.book(api, server.base, 8801, slot) == made  # the replay
    assert server.bookings_at(slot) == 1


def test_docs_httpx_examples(server: Server) -> None:
    slot = new_slot()
    made = client_httpx.book_with_httpx(server.base, ALICE, 8802, slot)
    assert made["slot"] == slot
    assert asyncio.run(client_httpx.book_async(server.base, ALICE, 8802, slot)) == made
    assert server.bookings_at(slot) == 1


def test_docs_job_example(server: Server, storeless_server: Server) -> None:
    api = client_requests.bookings_api(*ALICE)
    job = client_requests.BookingJob(id=8803, slot=new_slot())
    assert client_requests.run_booking_job(api, server.base, job) == "done"
    assert client_requests.run_booking_job(api, server.base, job) == "done"  # replayed
    assert server.bookings_at(job.slot) == 1
    other = client_requests.BookingJob(id=8803, slot=new_slot())  # a second job, same id
    assert client_requests.run_booking_job(api, server.base, other) == "failed"
    session = requests.Session()
    session.auth = ALICE
    short = IdempotentClient(session, policy=RetryPolicy(max_elapsed=1.0))
    busy = client_requests.BookingJob(id=8804, slot=new_slot())
    assert client_requests.run_booking_job(short, storeless_server.base, busy) == "retry later"


def test_threads_share_nothing_between_operations(server: Server) -> None:
    """One client, many threads at once: each operation keeps its own key and body."""
    with requests.Session() as session:
        session.auth = ALICE
        api = IdempotentClient(session)
        slots = [new_slot() for _ in range(8)]
        results: dict[str, int] = {}

        def book(slot: str) -> None:
            response = api.post(server.base + "/api/bookings/", json=booking(slot), location="t")
            results[slot] = response.status_code

        threads = [threading.Thread(target=book, args=(slot,)) for slot in slots]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert results == dict.fromkeys(slots, 201)
    assert [server.bookings_at(slot) for slot in slots] == [1] * 8
