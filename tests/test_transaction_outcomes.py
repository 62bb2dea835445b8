"""What is stored is decided by the transaction's real outcome, not by the response.

That guarantee, with real transactions on the test database (SQLite,
PostgreSQL, MariaDB) and both stores: a view that rolls its transaction back behind a
2xx, work whose COMMIT fails (a deferred foreign key; on MariaDB the INSERT fails, the
same rollback one statement earlier), and ``ATOMIC_REQUESTS`` on two databases where
one commits and a hook of the view then raises. The views are
``tests/transaction_outcomes/views.py``'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db import connection, connections
from django.http.response import HttpResponseBase
from django.test import Client, override_settings

from idempotency_django.models import IdempotencyRecord
from tests import tasks_app
from tests.real_stack.middleware import IDEMPOTENCY, QUEUEING, with_middleware
from tests.redis_helpers import redis_store_settings, stored_entries
from tests.testapp.models import Booking

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.transaction_outcomes.urls"),
]

STORES = ["database", "redis"]


def post(client: Client, path: str, key: str, **headers: str) -> Any:
    return client.post(
        path, {}, content_type="application/json", headers={"Idempotency-Key": key, **headers}
    )


@contextlib.contextmanager
def store(name: str) -> Iterator[None]:
    if name == "redis":
        with redis_store_settings():
            yield
    else:
        yield


def records(name: str) -> list[bytes | str]:
    """What the store holds: each entry's state."""
    if name == "redis":
        return [
            b"in_progress" if b'"state":"in_progress"' in value else b"completed"
            for value in stored_entries().values()
        ]
    return list(IdempotencyRecord.objects.values_list("state", flat=True))


@pytest.fixture
def client(alice: User) -> Client:
    """Alice's client; a 500 is an answer, as a real server sends it."""
    client = Client(raise_request_exception=False)
    client.force_login(alice)
    return client


# -- a 2xx whose transaction rolled back ---------------------------------------------


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize(
    ("path", "under_atomic_requests"),
    [
        pytest.param("/decorated-rolled-back/", False, id="idempotent-atomic"),
        pytest.param("/decorated-rolled-back/", True, id="idempotent-atomic-in-ATOMIC_REQUESTS"),
        pytest.param("/drf-rolled-back/", True, id="drf-api-view-ATOMIC_REQUESTS"),
        pytest.param("/viewset-rolled-back/", False, id="drf-viewset-atomic"),
    ],
)
def test_a_201_whose_transaction_rolled_back_is_not_kept(
    request: pytest.FixtureRequest,
    client: Client,
    path: str,
    under_atomic_requests: bool,
    store_name: str,
) -> None:
    """``transaction.set_rollback(True)`` in the view, then 201: the booking is gone, so
    no 201 may be replayed for it; the key is free and the retry runs the view again.
    (Not covered before: no test called ``set_rollback``.)"""
    if under_atomic_requests:
        request.getfixturevalue("atomic_requests")
    with store(store_name):
        first = post(client, path, "rolled-back-1")
        kept = records(store_name)
        retry = post(client, path, "rolled-back-1")
    assert first.status_code == 201
    assert kept == []
    assert (retry.status_code, retry.get("Idempotency-Replayed")) == (201, None)
    assert Booking.objects.count() == 0


@pytest.mark.parametrize("store_name", STORES)
def test_under_the_middleware_with_the_atomic_setting_a_rolled_back_201_is_not_kept(
    client: Client, store_name: str
) -> None:
    """``IDEMPOTENCY["ATOMIC"]`` without ``ATOMIC_REQUESTS``: the middleware's transaction
    is the view's only one, so the view's ``set_rollback`` marks it and the key is given
    back (contrast with the xfail below, where Django adds a savepoint of its own)."""
    with store(store_name):
        idempotency = getattr(django_settings, "IDEMPOTENCY", {})
        with override_settings(IDEMPOTENCY={**idempotency, "ATOMIC": True}):
            first = post(client, "/rolled-back/", "rolled-back-3")
            kept = records(store_name)
            retry = post(client, "/rolled-back/", "rolled-back-3")
    assert first.status_code == 201
    assert kept == []
    assert (retry.status_code, retry.get("Idempotency-Replayed")) == (201, None)
    assert Booking.objects.count() == 0


@pytest.mark.parametrize("store_name", STORES)
def test_with_the_atomic_setting_a_task_refusal_in_the_view_commits_nothing(
    client: Client, store_name: str
) -> None:
    """A task the view ran in-process refused its key (``TaskKeyReused``), which the
    middleware answers 409. Under ``IDEMPOTENCY["ATOMIC"]`` the transaction around the
    view is the middleware's, still open then: the order the view wrote before the task
    is rolled back with it, and the client's retry of the 409 writes nothing either.
    Before, each of them committed an order."""
    with store(store_name):
        idempotency = getattr(django_settings, "IDEMPOTENCY", {})
        with override_settings(IDEMPOTENCY={**idempotency, "ATOMIC": True}):
            tasks_app.book("08:00", idempotency_key="shared-task-key")  # the key's first use
            answers = [post(client, "/order-then-task/", "order-1") for _ in range(2)]
    assert [(a.status_code, a.json()["code"]) for a in answers] == [
        (409, "idempotency_key_reused")
    ] * 2
    assert list(Booking.objects.values_list("slot", flat=True)) == ["08:00"]


def keep_not_found_deletes(request: Any, response: HttpResponseBase, exception: Any) -> bool:
    """docs/settings.md's RETAIN_FUNCTION example, as it is there."""
    if request.method == "DELETE" and response.status_code == 404:
        return True
    return response.status_code < 400


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("atomic", ["ATOMIC_REQUESTS", "IDEMPOTENCY_ATOMIC"])
def test_a_kept_404_raised_after_a_write_is_replayed_and_its_write_rolled_back(
    client: Client, store_name: str, atomic: str
) -> None:
    """A DELETE's view writes, then raises Http404; the retain function keeps a DELETE's
    404. The view's writes roll back (its own block: Django's under ATOMIC_REQUESTS, the
    middleware's savepoint under ATOMIC), the claim before them does not: the 404 is
    kept, and the retry is its replay. (Rolling the whole transaction back lost the 404,
    and the retry ran the view again.)"""
    database = connections.settings["default"]
    database["ATOMIC_REQUESTS"] = atomic == "ATOMIC_REQUESTS"
    idempotency = {
        **getattr(django_settings, "IDEMPOTENCY", {}),
        "RETAIN_FUNCTION": f"{__name__}.keep_not_found_deletes",
        "ATOMIC": atomic == "IDEMPOTENCY_ATOMIC",
    }
    try:
        with store(store_name), override_settings(IDEMPOTENCY=idempotency):
            headers = {"Idempotency-Key": "cancel-1"}
            first = client.delete("/cancel/", headers=headers)
            again = client.delete("/cancel/", headers=headers)
    finally:
        database["ATOMIC_REQUESTS"] = False
    assert (first.status_code, again.status_code) == (404, 404)
    assert again.get("Idempotency-Replayed") == "true"
    assert Booking.objects.count() == 0


def test_a_key_rolls_back_no_transaction_a_projects_middleware_opened(
    client: Client, settings: Any
) -> None:
    """A project's middleware, before the idempotency one, writes its audit row in a
    transaction of its own; the view answers 403. The row stays, as without a key."""
    middleware = list(settings.MIDDLEWARE)
    position = middleware.index("idempotency_django.middleware.IdempotencyMiddleware")
    middleware.insert(position, "tests.transaction_outcomes.views.AuditMiddleware")
    settings.MIDDLEWARE = middleware
    assert post(client, "/forbidden/", "forbidden-1").status_code == 403
    assert Booking.objects.filter(slot="audit").count() == 1


@pytest.mark.xfail(
    strict=True,
    reason=(
        "IdempotencyMiddleware under ATOMIC_REQUESTS opens the view's transaction itself "
        "(transactions.view_transaction), so Django's own ATOMIC_REQUESTS block around the "
        "view becomes a savepoint inside it. When the view's block rolls back (set_rollback, "
        "or an exception a later middleware answers with process_exception), Django rolls "
        "back to the savepoint and clears needs_rollback: Attempt.finish sees an "
        "open, healthy transaction and stores the answer (database store: in it; Redis: "
        "after its commit), which then commits with the claim and nothing else."
    ),
)
@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize(
    ("path", "answered"),
    [
        pytest.param("/rolled-back/", 201, id="set_rollback"),
        pytest.param("/queued/", 202, id="process_exception"),
    ],
)
def test_under_the_middleware_a_2xx_whose_view_rolled_back_is_not_kept(
    settings: Any, client: Client, path: str, answered: int, store_name: str
) -> None:
    """The same view as a plain view behind ``IdempotencyMiddleware``: its booking rolled
    back, yet the retry is answered with a replay of it (``@idempotent`` and DRF, above,
    release the key)."""
    settings.MIDDLEWARE = with_middleware(QUEUEING, after=IDEMPOTENCY)
    with store(store_name):
        first = post(client, path, "rolled-back-2")
        retry = post(client, path, "rolled-back-2")
    assert first.status_code == answered
    assert Booking.objects.count() == 0
    assert retry.get("Idempotency-Replayed") is None, "a replay of work that never happened"


# -- a COMMIT that fails -------------------------------------------------------------

COMMITTING_VIEWS = [
    pytest.param("/booking/", True, id="middleware-ATOMIC_REQUESTS"),
    pytest.param("/decorated-booking/", False, id="idempotent-atomic"),
    pytest.param("/drf-booking/", False, id="drf-atomic"),
]


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize(("path", "under_atomic_requests"), COMMITTING_VIEWS)
def test_work_whose_commit_fails_keeps_no_answer_and_its_retry_runs_once(
    request: pytest.FixtureRequest,
    client: Client,
    path: str,
    under_atomic_requests: bool,
    store_name: str,
) -> None:
    """The library opened the transaction, and its COMMIT fails (PostgreSQL, SQLite: a
    deferred foreign key; MariaDB: the INSERT): 500, nothing kept, the key free. On one
    database with either store (the hangup tests cover the store on a second database,
    through the middleware only)."""
    if under_atomic_requests:
        request.getfixturevalue("atomic_requests")
    with store(store_name):
        first = post(client, path, "broken-1", **{"X-Break-Commit": "1"})
        kept = records(store_name)
        retry = post(client, path, "broken-1")
        again = post(client, path, "broken-1")
    assert first.status_code == 500
    assert kept == []
    assert (retry.status_code, retry.get("Idempotency-Replayed")) == (201, None)
    assert (again.status_code, again.get("Idempotency-Replayed")) == (201, "true")
    assert Booking.objects.count() == 1


@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize("store_name", STORES)
def test_a_commit_django_opened_that_fails_keeps_no_answer(client: Client, store_name: str) -> None:
    """DRF under Django's ``ATOMIC_REQUESTS``: the library never sees the COMMIT fail
    (Django's block is outside the view). The database store's reservation rolls back
    with the work: the retry runs once. The Redis store's, renewed before the commit,
    stays: 409 in progress until ``LOCK_TIMEOUT``, as docs/guarantees.md says; never a
    replay of the booking that did not commit."""
    if connection.vendor == "mysql":
        pytest.skip("MariaDB checks the foreign key at the INSERT: the view raises, no COMMIT")
    with store(store_name):
        first = post(client, "/drf-plain-booking/", "broken-2", **{"X-Break-Commit": "1"})
        kept = records(store_name)
        retry = post(client, "/drf-plain-booking/", "broken-2")
    assert first.status_code == 500
    if store_name == "redis":
        assert kept == [b"in_progress"]
        assert retry.status_code == 409
        assert retry.json()["code"] == "idempotency_key_in_progress"
        assert Booking.objects.count() == 0
    else:
        assert kept == []
        assert (retry.status_code, retry.get("Idempotency-Replayed")) == (201, None)
        assert Booking.objects.count() == 1


# -- ATOMIC_REQUESTS on two databases ----------------------------------------------


@pytest.fixture
def two_databases() -> Iterator[None]:
    """``ATOMIC_REQUESTS`` on ``default`` (the database store's) and on ``other``: a
    second connection to the same test database, as a second database would be."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has one writer: two connections writing at once wait for each other")
    databases = connections.settings
    databases["other"] = {**databases["default"], "ATOMIC_REQUESTS": True}
    databases["default"]["ATOMIC_REQUESTS"] = True
    # Connected here: a test case lets a test open only the connections it declared
    # (pytest-django declares those of DATABASES) or that are open already.
    connections["other"].connect()
    try:
        yield
    finally:
        databases["default"]["ATOMIC_REQUESTS"] = False
        connections["other"].close()
        del connections["other"]
        del databases["other"]


@pytest.mark.usefixtures("two_databases")
@pytest.mark.parametrize("store_name", STORES)
def test_on_two_databases_a_part_that_does_not_commit_keeps_no_answer(
    client: Client, store_name: str
) -> None:
    """The part on ``other`` fails (its COMMIT on PostgreSQL): the store's transaction,
    around it, rolls back with the claim and the other part. Not covered before: the
    hangup test puts the store on the second database, this one on the first."""
    with store(store_name):
        first = post(client, "/two-databases/", "two-1", **{"X-Break-Commit": "1"})
        kept = records(store_name)
        retry = post(client, "/two-databases/", "two-1")
        again = post(client, "/two-databases/", "two-1")
    assert first.status_code == 500
    assert kept == []
    assert (retry.status_code, retry.get("Idempotency-Replayed")) == (201, None)
    assert (again.status_code, again.get("Idempotency-Replayed")) == (201, "true")
    assert sorted(Booking.objects.values_list("slot", flat=True)) == ["default-part", "other-part"]


@pytest.mark.usefixtures("two_databases")
@pytest.mark.parametrize("store_name", STORES)
def test_on_two_databases_a_failing_hook_after_one_commit_frees_no_key(
    client: Client, store_name: str
) -> None:
    """``other`` commits, then a hook of the view on it raises (not robust). The error
    must not roll back the transactions still open around it: the default database's,
    with the claim (database store), would free the key of a booking already committed,
    and the retry would book on ``other`` a second time."""
    with store(store_name):
        first = post(client, "/two-databases/", "two-2", **{"X-Failing-Hook": "1"})
        retry = post(client, "/two-databases/", "two-2")
    assert first.status_code == 500  # the hook's error still reaches Django
    assert (retry.status_code, retry.get("Idempotency-Replayed")) == (201, "true"), retry.content
    assert sorted(Booking.objects.values_list("slot", flat=True)) == ["default-part", "other-part"]


# -- a DRF handler that answers with no Response -------------------------------------


@contextlib.contextmanager
def no_transaction_left_open() -> Iterator[None]:
    """Rolls back whatever atomic block a failed request left open on this thread's
    connection, so that a failing test fails alone (its teardown could not flush)."""
    try:
        yield
    finally:
        for block in reversed(list(connection.atomic_blocks)):
            block.__exit__(RuntimeError, RuntimeError("left open"), None)


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize(
    ("path", "booked"),
    [
        pytest.param("/no-response-atomic/", 0, id="atomic"),
        pytest.param("/no-response/", 1, id="no-transaction"),
    ],
)
def test_a_drf_handler_that_returns_no_response_leaves_no_transaction_nor_key(
    client: Client, path: str, booked: int, store_name: str
) -> None:
    """A viewset under ``@idempotent`` (``IdempotentMixin``) whose handler returns a dict:
    DRF's ``finalize_response`` raises (an assertion) before the mixin stores anything.
    The attempt must be aborted like any exception: the key given back, and with
    ``atomic=True`` the transaction the mixin opened closed (rolled back), not left open
    on the connection for the requests this thread serves next."""
    with no_transaction_left_open(), store(store_name):
        first = post(client, path, "no-response-1")
        left_open = connection.in_atomic_block
        kept = records(store_name)
    assert first.status_code == 500
    assert not left_open, "the mixin's transaction is still open after the request"
    assert kept == []
    assert Booking.objects.count() == booked


# -- a transaction the database aborted --------------------------------------------


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize(
    ("path", "under_atomic_requests"),
    [
        pytest.param("/swallowed-error/", False, id="idempotent-atomic"),
        pytest.param("/drf-swallowed-error/", True, id="drf-ATOMIC_REQUESTS"),
    ],
)
def test_a_transaction_postgresql_aborted_keeps_no_answer(
    request: pytest.FixtureRequest,
    client: Client,
    path: str,
    under_atomic_requests: bool,
    store_name: str,
) -> None:
    """The view swallowed a database error inside its transaction and answers 201. On
    PostgreSQL the transaction is aborted: its COMMIT is a ROLLBACK that raises nothing,
    and Django runs the ``on_commit`` hooks as after a commit. No 201 may be kept for the
    booking that rolled back. (The database store's completion fails in the aborted
    transaction: ``503 idempotency_unavailable``, nothing kept.)"""
    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL aborts a transaction on an error: elsewhere it commits")
    if under_atomic_requests:
        request.getfixturevalue("atomic_requests")
    with store(store_name):
        first = post(client, path, "aborted-1")
        kept = records(store_name)
        retry = post(client, path, "aborted-1")
    assert first.status_code in (201, 503)
    assert Booking.objects.count() == 0
    assert kept == []
    assert retry.get("Idempotency-Replayed") is None, "a replay of work that rolled back"
