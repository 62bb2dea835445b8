"""A client that hangs up, and failures after the view, on real servers: the work runs
once, decided by whether its transaction committed, not by what the client got."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from tests.hangup.servers import ASGI_SERVERS, Browser, serve
from tests.redis_helpers import REDIS_URL, raw_client, skip_without_redis
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

#: The view takes this long; the client gives up after 0.3 s and retries this much later.
VIEW_SECONDS = 1.5
RETRY_AFTER_SECONDS = 2.5

#: Path, and the slot each run of its view books: the views of every kind.
VIEWS = {
    "sync view, ATOMIC_REQUESTS": ("/sync/", "sync"),
    "async view": ("/async/", "async"),
    "async @idempotent view": ("/decorated-async/", "decorated-async"),
    "sync @idempotent view": ("/decorated-sync/", "decorated-sync"),
    "DRF view": ("/drf/", "drf"),
    "async webhook receiver": ("/hooks/provider-token/", "payment"),
}


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user("alice", password="alice-password")


def bookings(slot: str) -> int:
    return Booking.objects.filter(slot=slot).count()


def in_parallel(*calls: Any) -> list[Any]:
    with ThreadPoolExecutor(len(calls)) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


@pytest.mark.parametrize("server", ["uvicorn", "daphne", "gunicorn"])
def test_a_client_that_hangs_up_mid_request_gets_the_work_done_once(
    server: str, alice: User
) -> None:
    with serve(server, HANGUP_ATOMIC="1") as port:
        browser = Browser(port).login("alice", "alice-password")
        in_parallel(
            *(
                lambda path=path, slot=slot: browser.hang_up(
                    f"{path}?delay={VIEW_SECONDS}", key=f"train-{slot}", **delivery(slot)
                )
                for name, (path, slot) in VIEWS.items()
            )
        )
        time.sleep(RETRY_AFTER_SECONDS)
        retries = {
            name: retry_until_settled(
                browser, f"{path}?delay={VIEW_SECONDS}", f"train-{slot}", **delivery(slot)
            )
            for name, (path, slot) in VIEWS.items()
        }
    outcome = {name: (answer(retries[name]), bookings(slot)) for name, (_, slot) in VIEWS.items()}
    # A webhook sender's duplicate delivery is told so; an API client gets the replay.
    expected = {name: ("duplicate" if "webhook" in name else "replayed 201", 1) for name in VIEWS}
    if connection.vendor == "sqlite":
        # Six writers queue for SQLite's one write lock: a first request that waited
        # past the busy timeout wrote nothing, and its retry books (or accepts the
        # delivery) for the first time. Still one booking each: the count says so.
        first_time = {"201": "replayed 201", "202 accepted": "duplicate"}
        outcome = {
            name: (first_time.get(got, got), count) for name, (got, count) in outcome.items()
        }
    assert outcome == expected


def delivery(slot: str) -> dict[str, Any]:
    """The delivery id the webhook receiver trusts (the other views ignore it)."""
    return {"Webhook-Id": f"delivery-{slot}"}


def retry_until_settled(browser: Browser, path: str, key: str, **headers: str) -> Any:
    """Retry as the docs tell clients to: again after ``Retry-After`` while in progress."""
    deadline = time.monotonic() + 20
    while True:
        response = browser.post(path, key=key, **headers)
        if response.status != 409 or time.monotonic() > deadline:
            return response
        time.sleep(float(response.headers.get("retry-after", 1)))


def answer(response: Any) -> str:
    if response.status == 202 and response.json() == {"status": "duplicate"}:
        return "duplicate"
    if response.replayed:
        return f"replayed {response.status}"
    if response.status == 201:
        return "201"
    if response.status == 202 and response.json().get("status") == "accepted":
        return "202 accepted"
    return f"{response.status}: {response.body[:200].decode()}"


@pytest.mark.parametrize("server", ASGI_SERVERS)
def test_behind_a_sync_only_middleware_a_hang_up_keeps_the_key_until_the_lock_timeout(
    server: str, alice: User
) -> None:
    """A sync-only middleware after this one puts it in sync mode under ASGI: Django
    cancels the async view inside the worker thread, where nothing can shield it. The
    booking it made stays, so the key stays reserved: the retry is told to wait, and
    never books a second time while the reservation lives."""
    with serve(server, HANGUP_ATOMIC="1", HANGUP_SYNC_ONLY="1") as port:
        browser = Browser(port).login("alice", "alice-password")
        browser.hang_up(f"/async/?delay={VIEW_SECONDS}", key="sync-only-1")
        time.sleep(RETRY_AFTER_SECONDS)
        retry = browser.post(f"/async/?delay={VIEW_SECONDS}", key="sync-only-1")
    assert retry.status == 409
    assert retry.json()["code"] == "idempotency_key_in_progress"
    assert bookings("async") == 1


@pytest.mark.parametrize("server", ASGI_SERVERS)
@pytest.mark.parametrize("path", ["/async/", "/sync/"])
def test_a_hang_up_during_the_claim_leaves_no_stranded_key(
    server: str, path: str, alice: User
) -> None:
    """The store answers the claim slowly (a remote database); the client gives up
    meanwhile. The claim still commits: the view must run and its answer be kept."""
    with serve(server, HANGUP_STORE="slow") as port:
        browser = Browser(port).login("alice", "alice-password")
        browser.hang_up(path, key="claim-hang-up", after=0.3)
        time.sleep(RETRY_AFTER_SECONDS)
        retry = browser.post(path, key="claim-hang-up")
    assert (retry.status, retry.replayed) == (201, True), retry.body
    assert Booking.objects.count() == 1


@pytest.mark.parametrize("server", ["uvicorn", "daphne", "gunicorn"])
def test_a_view_that_lost_its_key_to_a_retry_commits_nothing(server: str, alice: User) -> None:
    """Redis store, ``LOCK_TIMEOUT=1``, ``ATOMIC_REQUESTS``: a 3 s view is taken over by a
    retry after 1.5 s. Under ASGI as under WSGI, the first one's writes must roll back."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite serializes writers: the retry waits for the first one's commit")
    skip_without_redis()
    redis_url = REDIS_URL
    raw = raw_client().from_url(redis_url)
    raw.flushdb()
    try:
        with serve(
            server, HANGUP_ATOMIC="1", HANGUP_STORE="redis", HANGUP_LOCK_TIMEOUT="1",
            HANGUP_REDIS_URL=redis_url,
        ) as port:  # fmt: skip
            browser = Browser(port).login("alice", "alice-password")

            def retry_later() -> Any:
                time.sleep(1.5)
                return browser.post("/sync/?delay=3", key="slow-1")

            first, retry = in_parallel(
                lambda: browser.post("/sync/?delay=3", key="slow-1"), retry_later
            )
    finally:
        raw.flushdb()
    assert sorted([first.status, retry.status]) == [201, 409], (first.body, retry.body)
    assert bookings("sync") == 1


@pytest.mark.parametrize("server", ["gunicorn", "uvicorn"])
@pytest.mark.parametrize(
    "failure", ["X-Fail-After", "X-Fail-Template"], ids=["later middleware", "template"]
)
def test_a_failure_after_the_view_rolls_the_work_back_with_the_key(
    server: str, failure: str, alice: User
) -> None:
    """A middleware after the idempotency one, or the template, fails once: 500. The
    work must not commit, since the key is free again: the retry books once."""
    path = "/template/" if failure == "X-Fail-Template" else "/sync/"
    slot = "template" if failure == "X-Fail-Template" else "sync"
    with serve(server, HANGUP_ATOMIC="1") as port:
        browser = Browser(port).login("alice", "alice-password")
        first = browser.post(path, key="after-1", **{failure: "1"})
        retry = browser.post(path, key="after-1")
        again = browser.post(path, key="after-1")
    assert first.status == 500
    assert (retry.status, retry.replayed) == (201, False)
    assert (again.status, again.replayed) == (201, True)
    assert bookings(slot) == 1


@pytest.mark.parametrize("server", ["gunicorn", "uvicorn"])
@pytest.mark.parametrize("store", ["redis", "database"])
def test_a_failing_on_commit_hook_of_the_view_skips_no_completion(
    server: str, store: str, alice: User
) -> None:
    """The view's own ``on_commit`` hook raises after the commit: the work committed,
    so its answer is kept and the retry replays it (not 409 until LOCK_TIMEOUT)."""
    environment = {"HANGUP_ATOMIC": "1", "HANGUP_STORE": store}
    if store == "redis":
        skip_without_redis()
        environment["HANGUP_REDIS_URL"] = REDIS_URL
        raw_client().from_url(environment["HANGUP_REDIS_URL"]).flushdb()
    with serve(server, **environment) as port:
        browser = Browser(port).login("alice", "alice-password")
        browser.post("/hooked/", key="hooked-1")
        retry = browser.post("/hooked/", key="hooked-1")
    assert (retry.status, retry.replayed) == (201, True), retry.body
    assert bookings("hooked") == 1


@pytest.mark.parametrize("server", ["gunicorn", "uvicorn"])
def test_a_drf_refusal_under_atomic_true_rolls_its_write_back(server: str, alice: User) -> None:
    """``@idempotent(atomic=True)`` without ``ATOMIC_REQUESTS``: the handler writes, then
    raises ``ValidationError``. DRF's own rollback covers only ``ATOMIC_REQUESTS``."""
    with serve(server) as port:
        browser = Browser(port).login("alice", "alice-password")
        answers = [
            browser.post("/drf-atomic/", key="taken-1", payload={"slot": "taken"}).status
            for _ in range(3)
        ]
    assert answers == [400, 400, 400]
    assert bookings("drf-atomic") == 0


@pytest.mark.parametrize("server", ["gunicorn", "uvicorn"])
def test_a_drf_refusal_under_atomic_requests_is_released_without_an_error(
    server: str, alice: User, tmp_path: Any
) -> None:
    """DRF rolls back the transaction of a 4xx from an ``APIException``; the reservation
    goes with it. That is a release, logged at INFO, not a failure at ERROR; and a
    4xx that rolled back cannot be kept, even with ``retain_client_errors``."""
    log = tmp_path / "idempotency.log"
    with serve(server, HANGUP_ATOMIC="1", HANGUP_LOG=str(log)) as port:
        browser = Browser(port).login("alice", "alice-password")
        refused = browser.post("/drf/", key="taken-2", payload={"slot": "taken"})
        retained = browser.post("/drf-retaining/", key="taken-3", payload={"slot": "taken"})
        again = browser.post("/drf-retaining/", key="taken-3", payload={"slot": "taken"})
    assert (refused.status, retained.status, again.status) == (400, 400, 400)
    assert not again.replayed
    assert bookings("drf") == bookings("drf-retaining") == 0
    lines = log.read_text().splitlines()
    assert not [line for line in lines if line.startswith(("ERROR", "WARNING"))], lines
    released = [line for line in lines if "event=released" in line]
    assert len(released) == 3 and all("reason=rollback" in line for line in released), lines


@pytest.mark.parametrize("server", ["gunicorn", "uvicorn"])
@pytest.mark.parametrize(
    "atomic_setting", ["0", "1"], ids=["ATOMIC_REQUESTS on both", "IDEMPOTENCY ATOMIC"]
)
def test_a_record_on_another_database_never_commits_before_its_work(
    server: str, atomic_setting: str, alice: User
) -> None:
    """The store on a second database. The work's COMMIT fails (a deferred foreign key):
    no 201 may be kept for a booking that does not exist, and the retry books once."""
    if connection.vendor != "postgresql":
        pytest.skip("a COMMIT that fails on a deferred foreign key, on two connections")
    environment = {"HANGUP_ATOMIC": "1", "HANGUP_STORE": "second-database"}
    with serve(server, HANGUP_ATOMIC_SETTING=atomic_setting, **environment) as port:
        browser = Browser(port).login("alice", "alice-password")
        first = browser.post("/unpaid/", key="unpaid-1", **{"X-Break-Commit": "1"})
        retry = browser.post("/unpaid/", key="unpaid-1")
        again = browser.post("/unpaid/", key="unpaid-1")
    assert first.status == 500
    assert (retry.status, retry.replayed) == (201, False), retry.body
    assert (again.status, again.replayed) == (201, True)
    assert bookings("unpaid") == 1
