"""The django-ninja integration through real servers: gunicorn (WSGI, threads) and uvicorn (ASGI).

Real sockets, a real login through the login page (CSRF enforced), DRF tokens as
bearer tokens, API keys; the work counted in the database the servers write to.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from idempotency_django.models import IdempotencyRecord
from tests.hangup.servers import Answer, Browser, serve
from tests.testapp.models import Booking

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

SERVERS = ["gunicorn", "uvicorn"]
SETTINGS = {"DJANGO_SETTINGS_MODULE": "tests.ninja_server.settings"}


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user("alice", password="alice-password")


@pytest.fixture
def bob(db: None) -> User:
    return User.objects.create_user("bob", password="bob-password")


def token(user: User) -> str:
    return str(Token.objects.create(user=user).key)


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def rows(**filters: Any) -> int:
    return Booking.objects.filter(**filters).count()


def in_parallel(count: int, call: Any) -> list[Answer]:
    with ThreadPoolExecutor(count) as pool:
        return [future.result() for future in [pool.submit(call) for _ in range(count)]]


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("path", ["/ninja/slow-bookings", "/ninja/async-slow-bookings"])
def test_a_storm_of_retries_runs_the_work_once(
    server: str, path: str, alice: User, bob: User
) -> None:
    alices, bobs = token(alice), token(bob)
    with serve(server, **SETTINGS) as port:
        client = Browser(port)
        answers = in_parallel(
            8, lambda: client.post(f"{path}?delay=0.5", "storm", {"slot": "s"}, **bearer(alices))
        )
        statuses = sorted(answer.status for answer in answers)
        assert set(statuses) <= {201, 409}, [(a.status, a.body) for a in answers]
        assert 201 in statuses
        in_progress = [a for a in answers if a.status == 409]
        assert all(a.json()["code"] == "idempotency_key_in_progress" for a in in_progress)
        first = next(a for a in answers if a.status == 201 and not a.replayed)
        replay = client.post(f"{path}?delay=0.5", "storm", {"slot": "s"}, **bearer(alices))
        assert replay.status == 201
        assert replay.replayed
        assert replay.body == first.body
        # Bob's key of the same name is his own: his work runs.
        bobs_answer = client.post(f"{path}?delay=0", "storm", {"slot": "s"}, **bearer(bobs))
        assert bobs_answer.status == 201
        assert not bobs_answer.replayed
    assert rows(owner=alice) == 1
    assert rows(owner=bob) == 1


#: With IdempotencyMiddleware too, as a project that protects plain views as well has it.
WITH_MIDDLEWARE = pytest.param({**SETTINGS, "NINJA_WITH_MIDDLEWARE": "1"}, id="with-middleware")


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("environment", [pytest.param(SETTINGS, id="ninja-only"), WITH_MIDDLEWARE])
def test_two_principals_in_one_cookie_jar_each_replay_their_own(
    server: str, environment: dict[str, str], alice: User, bob: User
) -> None:
    """Alice is logged in (session cookie); Bob's bearer token rides in the same jar."""
    bobs = token(bob)
    alices = token(alice)
    with serve(server, **environment) as port:
        jar = Browser(port).login("alice", "alice-password")
        as_bob = jar.post("/ninja/bookings", "shared", {"slot": "x"}, **bearer(bobs))
        as_alice = jar.post("/ninja/bookings", "shared", {"slot": "x"}, **bearer(alices))
        by_session = jar.post("/ninja/session-bookings", "by-session", {"slot": "x"})
        assert as_bob.status == as_alice.status == by_session.status == 201
        assert not as_alice.replayed
        assert as_bob.json()["customer"] == f"auth.user:{bob.pk}"
        assert as_alice.json()["customer"] == f"auth.user:{alice.pk}"
        assert by_session.json()["customer"] == f"auth.user:{alice.pk}"
        for answer, headers in ((as_bob, bearer(bobs)), (as_alice, bearer(alices))):
            replay = jar.post("/ninja/bookings", "shared", {"slot": "x"}, **headers)
            assert replay.replayed
            assert replay.body == answer.body
        session_replay = jar.post("/ninja/session-bookings", "by-session", {"slot": "x"})
        assert session_replay.replayed
        assert session_replay.body == by_session.body
    assert rows(owner=bob) == 1
    assert rows(owner=alice) == 2


@pytest.mark.parametrize("server", SERVERS)
def test_api_keys_scope_keys_on_a_real_server(server: str, db: None) -> None:
    with serve(server, **SETTINGS) as port:
        client = Browser(port)
        one = client.post(
            "/ninja/key-bookings", "k", {"slot": "k"}, **{"X-API-Key": "partner-one-key"}
        )
        two = client.post(
            "/ninja/key-bookings", "k", {"slot": "k"}, **{"X-API-Key": "partner-two-key"}
        )
        again = client.post(
            "/ninja/key-bookings", "k", {"slot": "k"}, **{"X-API-Key": "partner-one-key"}
        )
        assert one.status == two.status == 201
        assert one.json()["id"] != two.json()["id"]
        assert again.replayed
        assert again.body == one.body
    assert rows(slot="k") == 2


@pytest.mark.parametrize("server", SERVERS)
def test_an_unauthenticated_call_is_refused_by_ninja_and_stores_nothing(
    server: str, alice: User
) -> None:
    with serve(server, **SETTINGS) as port:
        client = Browser(port)
        for path in ("/ninja/bookings", "/ninja/async-bookings", "/ninja/key-bookings"):
            refused = client.post(path, "anonymous", {"slot": "n"}, **bearer("not-a-token"))
            assert refused.status == 401, (path, refused.body)
        # django_auth checks CSRF first: a caller without a session is refused 403.
        refused = client.post("/ninja/session-bookings", "anonymous", {"slot": "n"})
        assert refused.status == 403
        required = client.post("/ninja/required-bookings", "anonymous", {"slot": "n"})
        assert required.status == 401
    assert rows() == 0
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize("server", SERVERS)
def test_a_session_call_needs_its_csrf_token_and_a_refusal_stores_nothing(
    server: str, alice: User
) -> None:
    with serve(server, **SETTINGS) as port:
        jar = Browser(port).login("alice", "alice-password")
        csrf = jar.cookies.pop("csrftoken")
        refused = jar.post("/ninja/session-bookings", "no-csrf", {"slot": "c"})
        assert refused.status == 403
        jar.cookies["csrftoken"] = csrf
        accepted = jar.post("/ninja/session-bookings", "no-csrf", {"slot": "c"})
        assert accepted.status == 201
        assert not accepted.replayed
    assert rows(slot="c") == 1


@pytest.mark.parametrize("server", SERVERS)
def test_the_retry_client_does_not_retry_where_the_server_ignored_its_key(
    server: str, alice: User
) -> None:
    """An operation nothing protects: the middleware says the key was not used, the
    project's retry client believes it, and a 502 runs the work once, not five times."""
    import requests

    from idempotency_client import IdempotentClient, RequestRejected, RetryPolicy

    with serve(server, **{**SETTINGS, "NINJA_WITH_MIDDLEWARE": "1"}) as port:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token(alice)}"
        api = IdempotentClient(session, policy=RetryPolicy(attempts=5, max_elapsed=10.0))
        with pytest.raises(RequestRejected) as refused:
            api.post(
                f"http://127.0.0.1:{port}/ninja/unprotected-bookings",
                json={"slot": "u"},
                key="unprotected-1",
            )
    response = refused.value.response
    assert response is not None
    assert response.status_code == 502
    # Left alone by the middleware (ninja authenticates after it): "unprotected".
    assert response.headers["Idempotency-Key-Ignored"] == "unprotected"
    assert refused.value.attempts == 1
    assert rows(owner=alice) == 1
