"""Idempotent background tasks (idempotency_django.tasks) on each real store.

Deliveries are plain calls here, from threads for the concurrent ones; the
real queues' workers are in test_task_workers.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import Outcome, RecordKey, RequestInfo, StoreUnavailable, get_store
from idempotency_django.tasks import (
    TaskInProgress,
    TaskKeyReused,
    TaskResultNotStored,
    idempotent_task,
    split_options,
)
from tests import tasks_app
from tests.concurrency import in_threads
from tests.redis_helpers import (
    DOWN_ALIAS,
    caches_with,
    private_redis_server,
    redis_cache,
    redis_store_settings,
)
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

STORES = ["database", "redis", "memory"]
#: tasks_app.book under its own name, told at once of a duplicate that runs.
book_or_skip = idempotent_task(name="tests.tasks_app.book", duplicates="skip")(
    tasks_app.book.__wrapped__  # type: ignore[attr-defined]
)
TAKER = RequestInfo(method="TASK", path="slow", fingerprint="f" * 64, kind="task")


@contextlib.contextmanager
def store_settings(store: str, **idempotency: Any) -> Iterator[None]:
    if store == "redis":
        with redis_store_settings(**idempotency):
            yield
        return
    with override_settings(IDEMPOTENCY={"STORE": store, **idempotency}):
        get_store.cache_clear()
        try:
            yield
        finally:
            get_store.cache_clear()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[str]:
    with store_settings(request.param):
        yield request.param


def task_key(name: str, key: str) -> RecordKey:
    return RecordKey(f"task:{name}", "", key)


def test_a_duplicate_returns_the_stored_result_without_running(store: str) -> None:
    first = tasks_app.book("09:00", idempotency_key="order-1")
    second = tasks_app.book("09:00", idempotency_key="order-1")
    assert second == first == {"booking": first["booking"], "slot": "09:00"}
    assert Booking.objects.count() == 1
    # Another key is another task.
    tasks_app.book("09:00", idempotency_key="order-2")
    assert Booking.objects.count() == 2


def test_the_key_made_from_the_arguments(store: str) -> None:
    assert tasks_app.book_slot("10:00") == tasks_app.book_slot("10:00")
    assert tasks_app.book_slot("11:00") != tasks_app.book_slot("10:00")
    assert Booking.objects.count() == 2


def test_the_same_key_with_other_arguments_runs_nothing(store: str) -> None:
    tasks_app.book("09:00", idempotency_key="order-1")
    with pytest.raises(TaskKeyReused) as raised:
        tasks_app.book("10:00", idempotency_key="order-1")
    assert raised.value.code == "idempotency_key_reused"
    assert list(Booking.objects.values_list("slot", flat=True)) == ["09:00"]


def test_a_failed_task_leaves_no_write_and_its_retry_runs(store: str) -> None:
    with pytest.raises(tasks_app.Refused):
        tasks_app.book_then_fail("09:00", idempotency_key="order-1")
    assert Booking.objects.count() == 0  # rolled back with the reservation
    assert get_store().lookup(task_key("tests.tasks_app.book_then_fail", "order-1")) is None
    with pytest.raises(tasks_app.Refused):
        tasks_app.book_then_fail("09:00", idempotency_key="order-1")  # ran again


def test_a_result_that_is_not_json_stores_nothing_and_keeps_no_write(store: str) -> None:
    with pytest.raises(TypeError, match="not JSON"):
        tasks_app.book_and_return_an_object("09:00", idempotency_key="order-1")
    assert Booking.objects.count() == 0
    name = "tests.tasks_app.book_and_return_an_object"
    assert get_store().lookup(task_key(name, "order-1")) is None


def test_the_record_is_a_completed_task_record(store: str) -> None:
    tasks_app.book("09:00", idempotency_key="order-1")
    state = get_store().lookup(task_key("tests.tasks_app.book", "order-1"))
    assert state is not None and state.state == "completed"
    if store == "database":
        record = IdempotencyRecord.objects.get()
        assert (record.kind, record.method, record.path) == ("task", "TASK", "tests.tasks_app.book")
        assert (record.principal, record.key) == ("task:tests.tasks_app.book", "order-1")


@pytest.mark.parametrize("store", ["database"], indirect=True)
def test_without_atomic_the_record_still_completes(store: str) -> None:
    @idempotent_task(name="plain", atomic=False)
    def plain(slot: str) -> int:
        return Booking.objects.create(slot=slot).pk

    assert plain("09:00", idempotency_key="k") == plain("09:00", idempotency_key="k")
    assert Booking.objects.count() == 1


def test_the_key_is_required_and_checked(store: str) -> None:
    with pytest.raises(TypeError, match="needs a key"):
        tasks_app.book("09:00")
    with pytest.raises(TypeError, match="makes its own key"):
        tasks_app.book_slot("09:00", idempotency_key="mine")
    for bad in ("", "x" * 256, "new\nline"):
        with pytest.raises(ValueError, match="printable"):
            tasks_app.book("09:00", idempotency_key=bad)
    with pytest.raises(TypeError, match="not JSON"):
        tasks_app.book(object(), idempotency_key="k")
    assert Booking.objects.count() == 0


def concurrent_stores() -> list[str]:
    # SQLite has one writer: a concurrent claim inside a transaction fails at
    # once in DEFERRED mode (check W011). Concurrency is PostgreSQL's and Redis's.
    return STORES if connection.vendor == "postgresql" else ["redis", "memory"]


@pytest.mark.parametrize("store_name", concurrent_stores())
def test_concurrent_deliveries_wait_and_return_the_first_result(store_name: str) -> None:
    with store_settings(store_name):
        results = in_threads(
            4, lambda _i: tasks_app.book("09:00", pause=0.5, idempotency_key="order-1")
        )
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len({r["booking"] for r in results}) == 1
    assert Booking.objects.count() == 1


@pytest.mark.parametrize("store_name", concurrent_stores())
def test_concurrent_deliveries_are_skipped(store_name: str) -> None:
    with store_settings(store_name):
        results = in_threads(
            4, lambda _i: book_or_skip("09:00", pause=0.5, idempotency_key="order-1")
        )
    assert len([r for r in results if isinstance(r, TaskInProgress)]) == 3, results
    assert [r for r in results if isinstance(r, dict)] == [
        {"booking": Booking.objects.get().pk, "slot": "09:00"}
    ]


@pytest.mark.parametrize("store_name", concurrent_stores())
def test_a_waiting_duplicate_runs_when_the_first_fails(store_name: str) -> None:
    started, go_on = threading.Event(), threading.Event()
    runs: list[int] = []

    @idempotent_task(name="fails_first")
    def fails_first(slot: str) -> int:
        pk = Booking.objects.create(slot=slot).pk
        runs.append(pk)
        if len(runs) == 1:
            started.set()
            go_on.wait(10)
            raise tasks_app.Refused(slot)
        return pk

    def deliver(index: int) -> object:
        if index == 1:
            started.wait(10)
            threading.Timer(0.3, go_on.set).start()  # fail once the duplicate waits
        return fails_first("09:00", idempotency_key="k")

    with store_settings(store_name):
        results = in_threads(2, deliver)
    assert isinstance(results[0], tasks_app.Refused)
    assert len(runs) == 2 and results[1] == runs[1] == Booking.objects.get().pk


@pytest.mark.parametrize("store_name", ["redis", "memory"])
def test_a_task_that_lost_its_key_rolls_its_writes_back(store_name: str) -> None:
    """Past LOCK_TIMEOUT another delivery took the key over: ours must not commit."""

    @idempotent_task(name="slow")
    def slow(slot: str) -> int:
        pk = Booking.objects.create(slot=slot).pk
        get_store().clear()  # the reservation expired, and a redelivery claimed the key
        assert get_store().claim(task_key("slow", "k"), TAKER, 60).outcome is Outcome.CLAIMED
        return pk

    with store_settings(store_name):
        with pytest.raises(TaskInProgress, match="LOCK_TIMEOUT"):
            slow("09:00", idempotency_key="k")
        assert Booking.objects.count() == 0
        state = get_store().lookup(task_key("slow", "k"))
        assert state is not None and state.state == "in_progress"  # the redelivery's


def test_the_log_names_the_task_never_the_key_or_arguments(
    store: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="idempotency_django.tasks"):
        tasks_app.book("secret-slot", idempotency_key="secret-key")
        tasks_app.book("secret-slot", idempotency_key="secret-key")
    events = [(r.levelname, r.idempotency["event"]) for r in caplog.records]  # type: ignore[attr-defined]
    # One INFO record per run, its outcome at its end (issue 36).
    assert events == [("DEBUG", "reserved"), ("INFO", "stored"), ("INFO", "replayed")]
    assert "secret" not in caplog.text and "task=tests.tasks_app.book" in caplog.text


def test_with_the_protection_off_every_delivery_runs(store: str) -> None:
    with override_settings(IDEMPOTENCY={"STORE": store, "ENABLED": False}):
        tasks_app.book("09:00", idempotency_key="order-1")
        tasks_app.book("09:00", idempotency_key="order-1")
    assert Booking.objects.count() == 2


def test_a_store_that_cannot_be_reached_runs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Its one log line names the error, as a request's does: event=unavailable
    error=ConnectionError (it had no error= before)."""
    with (
        redis_store_settings(alias=DOWN_ALIAS),
        caplog.at_level(logging.DEBUG, logger="idempotency_django.tasks"),
        pytest.raises(StoreUnavailable),
    ):
        tasks_app.book("09:00", idempotency_key="order-1")
    assert Booking.objects.count() == 0
    fields = [record.idempotency for record in caplog.records]  # type: ignore[attr-defined]
    assert [(f["event"], f.get("error")) for f in fields] == [("unavailable", "ConnectionError")]


@pytest.mark.parametrize("atomic", [True, False])
def test_a_store_that_dies_mid_task(atomic: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Atomic: whether the key is still ours cannot be told, so nothing commits.
    Not atomic: the work committed on its own; its result could not be stored."""
    with private_redis_server() as (server, port):
        caches = caches_with(private=redis_cache(f"redis://127.0.0.1:{port}/0"))

        @idempotent_task(name="dies", atomic=atomic)
        def dies(slot: str) -> int:
            pk = Booking.objects.create(slot=slot).pk
            server.kill()
            server.wait()
            return pk

        with (
            redis_store_settings(alias="private", caches=caches),
            caplog.at_level(logging.DEBUG, logger="idempotency_django.tasks"),
        ):
            if atomic:
                with pytest.raises(StoreUnavailable):
                    dies("09:00", idempotency_key="k")
            else:
                assert dies("09:00", idempotency_key="k") == Booking.objects.get().pk
    fields = [record.idempotency for record in caplog.records]  # type: ignore[attr-defined]
    # Atomic: the renewal before the COMMIT failed (as a request's does); not
    # atomic: the completion after the work committed.
    levels = [record.levelname for record in caplog.records]
    assert [field["event"] for field in fields] == ["reserved", "store_failed"]
    assert levels == ["DEBUG", "ERROR"]
    # Why, and no HTTP status: a task has none.
    assert fields[1]["error"] == "ConnectionError" and "status" not in fields[1]
    assert Booking.objects.count() == (0 if atomic else 1)


@pytest.mark.parametrize("store_name", concurrent_stores())
def test_a_duplicate_inside_a_transaction_does_not_wait(store_name: str) -> None:
    """An eager task in a caller's transaction would wait holding its locks: it is told at once."""
    started, go_on = threading.Event(), threading.Event()

    @idempotent_task(name="held")
    def held(slot: str) -> int:
        started.set()
        go_on.wait(10)
        return Booking.objects.create(slot=slot).pk

    def deliver(index: int) -> object:
        if index == 0:
            return held("09:00", idempotency_key="k")
        started.wait(10)
        try:
            with pytest.raises(TaskInProgress), transaction.atomic():
                held("09:00", idempotency_key="k")
        finally:
            go_on.set()  # the first goes on only once the duplicate has its answer
        return "told at once"

    with store_settings(store_name):
        results = in_threads(2, deliver)
    assert results == [Booking.objects.get().pk, "told at once"]


@pytest.mark.parametrize("store_name", ["redis", "memory"])
@pytest.mark.parametrize("commits", [True, False])
def test_inside_a_callers_transaction_the_result_is_stored_when_it_commits(
    store_name: str, commits: bool
) -> None:
    """A store outside the database: the result of work that may still roll back is not kept."""
    key = task_key("tests.tasks_app.book", "order-1")
    # Decided before the caller's transaction (mypy narrows commits inside it).
    expected_state, expected_bookings = ("completed", 1) if commits else ("in_progress", 0)
    with store_settings(store_name), contextlib.suppress(tasks_app.Refused):
        with transaction.atomic():
            tasks_app.book("09:00", idempotency_key="order-1")
            assert get_store().lookup(key).state == "in_progress"  # type: ignore[union-attr]
            if not commits:
                raise tasks_app.Refused("the caller rolls back")
        state = get_store().lookup(key)
        assert state is not None
        assert state.state == expected_state
    assert Booking.objects.count() == expected_bookings


# -- once the work has committed, its key is never given back ------------------


@pytest.mark.parametrize("store_name", ["redis", "memory"])
def test_a_hook_of_the_task_that_raises_after_its_commit_keeps_the_key(store_name: str) -> None:
    """The task's on_commit hook (an email) raises after the COMMIT: the answer is stored."""

    @idempotent_task(name="notifies")
    def notifies(slot: str) -> int:
        pk = Booking.objects.create(slot=slot).pk
        transaction.on_commit(lambda: tasks_app.fail("the mail server is down"))
        return pk

    with store_settings(store_name):
        with pytest.raises(tasks_app.Refused):
            notifies("09:00", idempotency_key="k")
        assert Booking.objects.count() == 1
        assert notifies("09:00", idempotency_key="k") == Booking.objects.get().pk  # replayed
        assert Booking.objects.count() == 1


@pytest.mark.parametrize("store_name", ["database", "redis", "memory"])
def test_without_atomic_a_result_that_is_not_json_keeps_the_key_of_the_committed_work(
    store_name: str,
) -> None:
    """The write is in (autocommit) before the result fails to serialise: no second run."""

    @idempotent_task(name="returns_an_object", atomic=False)
    def returns_an_object(slot: str) -> object:
        Booking.objects.create(slot=slot)
        return object()

    with store_settings(store_name):
        with pytest.raises(TypeError, match="not JSON"):
            returns_an_object("09:00", idempotency_key="k")
        with pytest.raises(TaskResultNotStored):
            returns_an_object("09:00", idempotency_key="k")
    assert Booking.objects.count() == 1


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("commits", [True, False])
def test_without_atomic_a_result_that_is_not_json_in_a_callers_transaction_waits_for_it(
    store_name: str, commits: bool
) -> None:
    """The caller catches the TypeError. Its COMMIT keeps the key of the work: duplicates
    raise TaskResultNotStored (the key was given back at once, and the next delivery
    booked a second time). Its rollback takes the work back and frees the key (at once
    in the database, LOCK_TIMEOUT later in a store outside it): the next delivery runs.
    """

    @idempotent_task(name="returns_an_object_in_caller", atomic=False)
    def returns_an_object(slot: str) -> object:
        Booking.objects.create(slot=slot)
        return object()

    with store_settings(store_name, LOCK_TIMEOUT=1, HEARTBEAT=0.2):
        with contextlib.suppress(tasks_app.Refused), transaction.atomic():
            with pytest.raises(TypeError, match="not JSON"):
                returns_an_object("09:00", idempotency_key="k")
            if not commits:
                raise tasks_app.Refused("the caller rolls back")
        if commits:
            assert Booking.objects.count() == 1
            with pytest.raises(TaskResultNotStored):
                returns_an_object("09:00", idempotency_key="k")
            assert Booking.objects.count() == 1
        else:
            assert Booking.objects.count() == 0
            time.sleep(1.5)  # LOCK_TIMEOUT and a few beats: renewed, it would still be held
            with pytest.raises(TypeError, match="not JSON"):
                returns_an_object("09:00", idempotency_key="k")  # ran again
            assert Booking.objects.count() == 1


@pytest.mark.parametrize("store", ["database"], indirect=True)
def test_without_atomic_a_failure_inside_a_callers_transaction_gives_the_key_back(
    store: str,
) -> None:
    """No savepoint of ours: the caller that catches the error and commits frees the key."""

    @idempotent_task(name="fails_plainly", atomic=False)
    def fails_plainly(slot: str) -> int:
        tasks_app.fail("refused")
        return 0

    with transaction.atomic(), pytest.raises(tasks_app.Refused):
        fails_plainly("09:00", idempotency_key="k")
    assert get_store().lookup(task_key("fails_plainly", "k")) is None
    with pytest.raises(tasks_app.Refused):
        fails_plainly("09:00", idempotency_key="k")  # ran again, not "in progress"


@pytest.mark.parametrize("store_name", ["redis", "memory"])
def test_with_the_heartbeat_a_task_keeps_its_key_past_lock_timeout(store_name: str) -> None:
    """LOCK_TIMEOUT 1 s, HEARTBEAT 0.2 s, a 2.5 s task: a duplicate at 1.5 s is skipped."""

    with store_settings(store_name, LOCK_TIMEOUT=1, HEARTBEAT=0.2):
        first = threading.Thread(
            target=book_or_skip, args=("09:00", 2.5), kwargs={"idempotency_key": "hb"}
        )
        first.start()
        time.sleep(1.5)
        with pytest.raises(TaskInProgress):
            book_or_skip("09:00", 2.5, idempotency_key="hb")
        first.join()
        assert tasks_app.book("09:00", 2.5, idempotency_key="hb")["slot"] == "09:00"
    assert Booking.objects.count() == 1


def test_an_async_function_is_refused_when_decorated() -> None:
    async def later() -> None:
        return None

    with pytest.raises(TypeError, match="async"):
        idempotent_task(later)


def test_a_key_of_none_is_refused(store: str) -> None:
    @idempotent_task(name="keyed_by_a_missing_field", key=lambda order: order.get("id"))
    def keyed(order: dict[str, Any]) -> int:
        return Booking.objects.create(slot="x").pk

    with pytest.raises(ValueError, match="not NoneType"):
        keyed({})
    assert Booking.objects.count() == 0


def test_an_unknown_option_is_refused() -> None:
    with pytest.raises(TypeError, match="unknown options: atomc"):
        idempotent_task(name="typo", atomc=False)  # type: ignore[call-overload]


def test_a_queue_decorators_options_are_split_between_the_task_and_the_queue() -> None:
    def key(slot: str) -> str:
        return slot

    options = {"key": key, "atomic": False, "retention": 5, "name": "n", "bind": True}
    assert split_options(options) == (
        {"key": key, "atomic": False, "retention": 5},
        {"name": "n", "bind": True},
    )
