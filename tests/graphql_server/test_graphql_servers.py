"""GraphQL mutations through real servers: gunicorn (WSGI, threads, the sync view and
resolver) and uvicorn (ASGI, the async view and resolver). Real sockets, real sessions
with CSRF enforced; the work counted in the database the servers write to. One server
of each kind for the whole module."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests import servers
from tests.testapp.models import Booking

pytest.importorskip("strawberry")

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

GUNICORN = [
    "gunicorn", "tests.graphql_server.app:wsgi", "--worker-class", "gthread",
    "--workers", "1", "--threads", "8", "--log-level", "warning",
]  # fmt: skip


@dataclass(frozen=True)
class Server:
    kind: str
    port: int
    #: The view and the mutation each server runs: sync under WSGI, async under ASGI.
    path: str
    mutation: str


@pytest.fixture(scope="module", params=["gunicorn", "uvicorn"])
def server(request: pytest.FixtureRequest, django_db_setup: None) -> Iterator[Server]:
    kind = str(request.param)
    pytest.importorskip(kind)
    if kind == "gunicorn":
        command = lambda port: [*GUNICORN, "--bind", f"127.0.0.1:{port}"]  # noqa: E731
        path, mutation = "/graphql/", "book"
    else:
        command = lambda port: servers.uvicorn("tests.graphql_server.app:asgi", port)  # noqa: E731
        path, mutation = "/async-graphql/", "bookAsync"
    settings = {"DJANGO_SETTINGS_MODULE": "tests.graphql_server.settings"}
    with servers.running(command, settings, what=kind, ready_path=path) as port:
        yield Server(kind, port, path, mutation)


def book(server: Server, key: str, slot: str = "09:00", delay: float = 0) -> str:
    return (
        f'mutation {{ {server.mutation}(idempotencyKey: "{key}", slot: {{name: "{slot}"}}, '
        f"delay: {delay}) {{ id customer slot {{ name }} }} }}"
    )


def session(user: User) -> dict[str, str]:
    """``user``'s session cookie and CSRF token, made once per test in its thread: a
    connection opened by a client thread would outlive the test."""
    return servers.logged_in_headers(user)


def request_bytes(server: Server, user: dict[str, str], query: str) -> tuple[dict[str, str], bytes]:
    body = json.dumps({"query": query}).encode()
    headers = {
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
        "Host": f"127.0.0.1:{server.port}",
        **user,
    }
    return headers, body


def ask(server: Server, user: dict[str, str], query: str, timeout: float = 30) -> dict[str, Any]:
    headers, body = request_bytes(server, user, query)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        connection.request("POST", server.path, body=body, headers=headers)
        response = connection.getresponse()
        assert response.status == 200, (response.status, response.read()[:500])
        return json.loads(response.read())  # type: ignore[no-any-return]
    finally:
        connection.close()


def codes(answer: dict[str, Any]) -> list[str]:
    return [error["extensions"]["code"] for error in answer.get("errors", [])]


def until_answered(server: Server, user: dict[str, str], query: str) -> dict[str, Any]:
    """Retry while the key is in progress (as a client honouring the code does)."""
    deadline = time.monotonic() + 15
    while True:
        answer = ask(server, user, query)
        if codes(answer) != ["idempotency_key_in_progress"] or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


@pytest.fixture
def alice(transactional_db: None) -> User:
    return User.objects.create_user("alice", password="alice-password")


@pytest.fixture
def bob(transactional_db: None) -> User:
    return User.objects.create_user("bob", password="bob-password")


def test_a_storm_of_retries_runs_the_mutation_once(server: Server, alice: User, bob: User) -> None:
    storm = book(server, "storm", delay=0.5)
    alices = session(alice)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: ask(server, alices, storm), range(8)))
    done = [answer for answer in answers if "errors" not in answer]
    assert done, answers
    assert all(codes(a) == ["idempotency_key_in_progress"] for a in answers if a not in done)
    assert all(answer == done[0] for answer in done)  # the waiters, if any, got its answer
    assert ask(server, alices, storm) == done[0]
    # Bob's key of the same name is his own: his mutation runs, and answers him.
    bobs = ask(server, session(bob), book(server, "storm", delay=0.5))
    assert bobs["data"][server.mutation]["customer"] == f"auth.user:{bob.pk}"
    assert done[0]["data"][server.mutation]["customer"] == f"auth.user:{alice.pk}"
    assert Booking.objects.filter(owner=alice).count() == 1
    assert Booking.objects.filter(owner=bob).count() == 1


def test_two_mutations_with_two_keys_in_one_request(server: Server, alice: User) -> None:
    def both(second_key: str) -> str:
        return (
            f'mutation {{ first: {server.mutation}(idempotencyKey: "one", slot: {{name: "a"}}) '
            f"{{ id }} second: {server.mutation}(idempotencyKey: "
            f'"{second_key}", slot: {{name: "b"}}) {{ id }} }}'
        )

    alices = session(alice)
    first = ask(server, alices, both("two"))
    assert "errors" not in first, first
    assert ask(server, alices, both("two")) == first
    third = ask(server, alices, both("three"))
    assert third["data"]["first"] == first["data"]["first"]  # replayed
    assert third["data"]["second"] != first["data"]["second"]  # a new key: it ran
    assert Booking.objects.count() == 3


def hang_up(server: Server, user: dict[str, str], query: str, after: float) -> None:
    """Send the whole request, then close the socket ``after`` seconds later, unread."""
    headers, body = request_bytes(server, user, query)
    head = f"POST {server.path} HTTP/1.1\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()
    )
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        time.sleep(after)
        sock.shutdown(socket.SHUT_RDWR)


def test_a_hang_up_mid_mutation_is_never_run_twice(server: Server, alice: User) -> None:
    query, alices = book(server, "hang-up", delay=0.8), session(alice)
    hang_up(server, alices, query, after=0.2)
    retry = ask(server, alices, query)
    # The mutation still runs (the hung-up one, or this retry if it claimed first).
    assert codes(retry) in (["idempotency_key_in_progress"], []), retry
    answer = until_answered(server, alices, query)
    assert answer["data"][server.mutation]["id"] == Booking.objects.get().pk


def test_a_clients_retry_after_a_lost_answer_runs_the_mutation_once(
    server: Server, alice: User
) -> None:
    """The issue's closing evidence: the client gives up waiting for its first answer
    (a read timeout: the answer is lost to it), retries with the same key, and gets
    the result of the one run the database shows."""
    query, alices = book(server, "lost-answer", slot="10:00", delay=1.0), session(alice)
    with pytest.raises(TimeoutError):
        ask(server, alices, query, timeout=0.3)
    # The first run goes on without its client (under ASGI too, where Django cancels
    # the view of a client that left): the retry finds it still running.
    assert codes(ask(server, alices, query)) == ["idempotency_key_in_progress"]
    answer = until_answered(server, alices, query)
    booked = answer["data"][server.mutation]
    row = Booking.objects.get()
    assert (booked["id"], booked["slot"]["name"], row.slot) == (row.pk, "10:00", "10:00")
