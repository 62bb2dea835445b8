"""A task goes through the key protocol a request goes through: the cases that differed.

In-process, on the real Redis store and database: the heartbeat of a task
whose caller rolled back, keyed fingerprints, the types Celery's JSON hands
back, a call refused when sent, Celery's retries of a delivery that ran
nothing, and a completion that races a renewal. The real workers and servers
are in test_task_workers.py and test_task_views.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from types import ModuleType
from typing import Any

import pytest
from django.db import transaction

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import RecordKey, StoreUnavailable, get_store
from idempotency_django.stores.redis import RedisStore
from idempotency_django.tasks import TaskInProgress, idempotent_task
from tests.concurrency import in_threads
from tests.redis_helpers import DOWN_ALIAS, raw_client, redis_store_settings
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

#: A short LOCK_TIMEOUT renewed by a fast heartbeat, bounded far later.
HEARTBEAT: dict[str, Any] = {
    "LOCK_TIMEOUT": 1,
    "HEARTBEAT": {"INTERVAL": 0.1, "MAX_RUN_TIME": 30},
}


class Refused(Exception):
    pass


@pytest.fixture
def celery_tasks() -> ModuleType:
    pytest.importorskip("celery")
    from tests import celery_app, celery_tasks

    celery_app.app.set_current()
    return celery_tasks


@pytest.fixture
def django_tasks() -> ModuleType:
    pytest.importorskip("django_tasks_db")
    from tests import django_tasks_app

    return django_tasks_app


# -- a task in its caller's transaction: renewed only while that is open ---------


def run_in_process(door: str, celery: ModuleType, framework: ModuleType) -> None:
    if door == "celery":
        celery.book_slot_or_skip("09:00")  # the task object called: Celery runs it here
    else:
        framework.book_now.enqueue("09:00")  # the ImmediateBackend runs it here


@pytest.mark.parametrize("door", ["celery", "django_tasks"])
def test_a_task_whose_caller_rolled_back_frees_its_key_after_lock_timeout(
    door: str, request: pytest.FixtureRequest
) -> None:
    """Its result waits for the caller's COMMIT; the caller rolls back instead.

    The heartbeat renewed the key until MAX_RUN_TIME (30 s here, 5 minutes by
    default): every later delivery was refused in progress. Now it stops with
    the rollback, and the key is free LOCK_TIMEOUT (1 s) after.
    """
    celery = request.getfixturevalue("celery_tasks") if door == "celery" else None
    framework = request.getfixturevalue("django_tasks") if door != "celery" else None
    with redis_store_settings(**HEARTBEAT):
        with contextlib.suppress(Refused), transaction.atomic():
            run_in_process(door, celery, framework)  # type: ignore[arg-type]
            raise Refused("the caller rolls back")
        assert Booking.objects.count() == 0
        time.sleep(2.5)  # LOCK_TIMEOUT and a few beats: renewed, it would still be held
        run_in_process(door, celery, framework)  # type: ignore[arg-type]
    assert Booking.objects.count() == 1


def test_a_task_in_its_callers_open_transaction_keeps_its_key_past_lock_timeout() -> None:
    """The same rule's other side: while the caller still runs, the key stays held."""

    @idempotent_task(name="in_caller")
    def in_caller(slot: str) -> int:
        return Booking.objects.create(slot=slot).pk

    with redis_store_settings(**HEARTBEAT), transaction.atomic():
        in_caller("09:00", idempotency_key="k")
        time.sleep(2)  # twice LOCK_TIMEOUT: only the heartbeat keeps it
        assert get_store().is_held(RecordKey("task:in_caller", "", "k"))
    assert get_store().lookup(RecordKey("task:in_caller", "", "k")) is None  # flushed after


# -- fingerprints --------------------------------------------------------------


def test_a_task_fingerprint_is_keyed() -> None:
    """A PIN passed as an argument cannot be recovered by hashing guesses of it."""

    @idempotent_task(name="unlock")
    def unlock(pin: str) -> bool:
        return True

    unlock("4821", idempotency_key="k")
    stored = IdempotencyRecord.objects.get(kind="task").fingerprint
    guesses = {
        hashlib.sha256(
            json.dumps(
                ["unlock", [f"{pin:04d}"], {}], sort_keys=True, separators=(",", ":")
            ).encode()
        ).hexdigest()
        for pin in range(10_000)
    }
    assert stored not in guesses


def test_celerys_json_types_are_fingerprinted_and_come_back_as_themselves(
    celery_tasks: ModuleType,
) -> None:
    """kombu hands the task UUID, datetime and Decimal objects: they ran nothing before."""
    order, at = uuid.uuid4(), datetime(2026, 12, 5, 9, 30, tzinfo=UTC)
    first = celery_tasks.book_order(order, at, Decimal("10.50"))
    again = celery_tasks.book_order(order, at, Decimal("10.50"))
    assert (
        first
        == again
        == {
            "booking": Booking.objects.get().pk,
            "order": order,
            "at": at,
            "amount": Decimal("21.00"),
        }
    )


def test_arguments_the_fingerprint_cannot_hold_are_refused_when_sent(
    celery_tasks: ModuleType,
) -> None:
    """Pickle sends anything: a worker could not fingerprint it, and Celery would
    acknowledge that failure (the task lost). Refused by delay(), nothing sent."""
    client = raw_client()
    queue = celery_tasks.book_pickled.app.conf.task_default_queue
    client.delete(queue)
    with pytest.raises(TypeError, match="cannot be fingerprinted"):
        celery_tasks.book_pickled.delay(object(), idempotency_key="k")
    with pytest.raises(TypeError, match="needs a key"):
        celery_tasks.book_pickled.delay("09:00")
    assert client.llen(queue) == 0


# -- Celery's retries: an eager run that ran nothing is told at once ---------------
# (A worker's delivery is retried without a limit: tests/test_task_workers.py.)


def task_events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.idempotency["event"]  # type: ignore[attr-defined]
        for record in caplog.records
        if record.name == "idempotency_django.tasks"
    ]


@pytest.mark.parametrize("in_transaction", [True, False], ids=["in-a-transaction", "alone"])
def test_an_eager_task_is_told_at_once_that_its_key_is_taken(
    celery_tasks: ModuleType, caplog: pytest.LogCaptureFixture, in_transaction: bool
) -> None:
    """Another delivery runs the key: apply() (delay() under task_always_eager) claims
    once and gets TaskInProgress: a task that waits for it cannot in a transaction of
    its caller, one with ``duplicates="skip"`` does not.

    Celery retried it at once, its countdown skipped (in the caller's
    transaction, holding its locks): four claims, and with retries unlimited,
    no end.
    """
    task = celery_tasks.book_slot if in_transaction else celery_tasks.book_slot_or_skip
    key = RecordKey(f"task:{task.name}", "", "slot-09:00")

    def deliver(index: int) -> object:
        if index == 0:  # holds the key for a second
            return task.apply(args=("09:00", 1.0)).get()
        deadline = time.monotonic() + 10
        while not get_store().is_held(key) and time.monotonic() < deadline:
            time.sleep(0.01)
        with transaction.atomic() if in_transaction else contextlib.nullcontext():
            return task.apply(args=("09:00", 1.0)).result

    with redis_store_settings(), caplog.at_level(logging.DEBUG, logger="idempotency_django.tasks"):
        first, duplicate = in_threads(2, deliver)
    assert first == Booking.objects.get().pk
    assert isinstance(duplicate, TaskInProgress), duplicate
    assert task_events(caplog).count("conflict") == 1


@pytest.mark.parametrize("in_transaction", [True, False], ids=["in-a-transaction", "alone"])
def test_an_eager_task_is_told_at_once_that_the_store_is_down(
    celery_tasks: ModuleType, caplog: pytest.LogCaptureFixture, in_transaction: bool
) -> None:
    """The same with the store down: one claim, and the caller gets StoreUnavailable
    (with retries unlimited, Celery's eager retries recursed until the stack overflowed)."""
    with (
        redis_store_settings(alias=DOWN_ALIAS),
        caplog.at_level(logging.DEBUG, logger="idempotency_django.tasks"),
        transaction.atomic() if in_transaction else contextlib.nullcontext(),
    ):
        result = celery_tasks.book_slot_or_skip.apply(args=("09:00",))
    assert isinstance(result.result, StoreUnavailable), result.result
    assert task_events(caplog) == ["unavailable"]
    assert Booking.objects.count() == 0


class PaymentGatewayDown(Exception):
    pass


GATEWAY_RUNS: list[int] = []


def test_a_bound_tasks_own_retries_keep_celerys_limit(celery_tasks: ModuleType) -> None:
    """Only a delivery that ran nothing is retried without a limit: a task's own
    ``self.retry()`` keeps Celery's default of three (the task-wide ``max_retries=None``
    first tried for the former lifted it for both)."""
    from idempotency_django.contrib.celery import shared_task

    @shared_task(bind=True, key=lambda order: f"charge-{order}", name="tests.charge_retrying")
    def charge(self: Any, order: int) -> str:
        GATEWAY_RUNS.append(order)
        if len(GATEWAY_RUNS) > 10:
            return "still retrying after 10 runs"
        raise self.retry(exc=PaymentGatewayDown("the gateway is down"), countdown=0)

    GATEWAY_RUNS.clear()
    with redis_store_settings():
        result = charge.apply(args=(1,))
    assert isinstance(result.result, PaymentGatewayDown), (result.result, len(GATEWAY_RUNS))
    assert len(GATEWAY_RUNS) == 4  # the first run and Celery's three retries


# -- the heartbeat and a completion that races it --------------------------------


class CompletesSlowly(RedisStore):
    """The real Redis store, slow to return from a completion it has made (a slow network)."""

    def complete(self, *args: Any, **kwargs: Any) -> bool:
        owned = super().complete(*args, **kwargs)
        time.sleep(0.3)  # the heartbeat renews meanwhile, and finds it completed
        return owned


@contextlib.contextmanager
def slow_completions() -> Iterator[None]:
    with redis_store_settings(LOCK_TIMEOUT=5, HEARTBEAT=0.02, STORE=f"{__name__}.CompletesSlowly"):
        yield


def test_a_completion_racing_a_renewal_is_not_a_lost_heartbeat(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @idempotent_task(name="quick")
    def quick(slot: str) -> int:
        time.sleep(0.1)  # a few beats while it runs
        return Booking.objects.create(slot=slot).pk

    with slow_completions(), caplog.at_level(logging.WARNING, logger="idempotency_django"):
        assert isinstance(get_store(), CompletesSlowly)
        quick("09:00", idempotency_key="k")
        time.sleep(0.1)
    assert [r.getMessage() for r in caplog.records if "heartbeat_lost" in r.getMessage()] == []


def test_the_settled_answer_is_what_a_duplicate_gets() -> None:
    """Not in progress after a completion that raced its renewal: stored, and replayed."""

    @idempotent_task(name="quick_twice")
    def quick_twice(slot: str) -> int:
        return Booking.objects.create(slot=slot).pk

    with slow_completions():
        first = quick_twice("09:00", idempotency_key="k")
        state = get_store().lookup(RecordKey("task:quick_twice", "", "k"))
        assert state is not None and state.state == "completed"
        assert quick_twice("09:00", idempotency_key="k") == first
    assert Booking.objects.count() == 1
