"""Idempotent tasks through real queues: a Celery worker, the tasks framework's db_worker.

Each worker is a process of its own on the test database (committed data:
``transactional_db``) and, for Celery, on the tests' Redis database as broker.
Duplicates are real deliveries: the same task sent twice, and a delivery that
the broker hands out again after its worker was killed mid-task.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests import servers
from tests.redis_helpers import REDIS_URL, raw_client, skip_without_redis
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
#: Each store's settings in the worker; the Redis store's reservations outlive a
#: killed worker until LOCK_TIMEOUT, kept short here.
STORES: dict[str, dict[str, object]] = {
    "database": {"STORE": "database"},
    "redis": {"STORE": "redis", "STORE_OPTIONS": {"cache": "idempotency"}, "LOCK_TIMEOUT": 4},
}


#: This run's queue (tests/celery_app.py reads it), set before the app is first imported.
os.environ.setdefault("TESTS_CELERY_QUEUE", f"idempotency-django-tests-{os.getpid()}")


def worker_env(idempotency: dict[str, object]) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.task_worker_settings",
        "TESTS_DB_NAME": str(connection.settings_dict["NAME"]),
        "TESTS_REDIS_URL": REDIS_URL,
        "TESTS_IDEMPOTENCY": json.dumps(idempotency),
    }


class Worker:
    """A worker process of its own session, so that a SIGKILL takes all of it."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_for(self, text: str) -> None:
        servers.wait_until(
            lambda: text in self.log.read_text(errors="replace"),
            self.process,
            what="the worker",
            seconds=60,
            log=self.log,
        )

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


# -- Celery --------------------------------------------------------------------


def celery_command(pool: str, concurrency: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.celery_app",
        "worker",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        "--loglevel=INFO",
        "--without-heartbeat",
        "--without-gossip",
        "--without-mingle",
    ]


@contextlib.contextmanager
def celery_workers(
    idempotency: dict[str, object], log: Path, broker: str = ""
) -> Iterator[Callable[..., Worker]]:
    """Start Celery workers with these settings (and ``broker``); stop them all after."""
    pytest.importorskip("celery")
    skip_without_redis()
    raw_client().flushdb()
    env = worker_env(idempotency)
    if broker:
        env["TESTS_BROKER_URL"] = broker
    started: list[Worker] = []

    def start(pool: str = "solo", concurrency: int = 1) -> Worker:
        worker = Worker(celery_command(pool, concurrency), env, log)
        started.append(worker)
        worker.wait_for("ready.")
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()
        raw_client().flushdb()


@pytest.fixture(params=sorted(STORES))
def celery_worker(
    request: pytest.FixtureRequest, transactional_db: None, tmp_path: Path
) -> Iterator[Callable[..., Worker]]:
    with celery_workers(STORES[request.param], tmp_path / "worker.log") as start:
        yield start


def celery_tasks():  # type: ignore[no-untyped-def]
    os.environ.setdefault("TESTS_REDIS_URL", REDIS_URL)
    from tests import celery_app, celery_tasks

    celery_app.app.set_current()  # the tasks send through the tests' broker
    return celery_tasks


def test_a_task_sent_twice_runs_once(celery_worker: Callable[..., Worker]) -> None:
    tasks = celery_tasks()
    worker = celery_worker(pool="prefork", concurrency=2)
    # Both deliveries at once on two worker processes: the second waits for the first.
    first = tasks.book_slot.apply_async(("09:00", 1.0))
    second = tasks.book_slot.apply_async(("09:00", 1.0))
    assert first.get(timeout=60) == second.get(timeout=60) == Booking.objects.get().pk
    log = worker.log.read_text(errors="replace")
    assert log.count("event=stored") == 1 and log.count("event=replayed") == 1, log
    # The duplicate waited for the first: for the store to settle, or in the claim
    # itself behind the first one's lock, on SQLite (its write lock) and MariaDB (the
    # first one's uncommitted row under the unique key: the INSERT waits for it).
    assert "event=waiting" in log or connection.vendor in ("sqlite", "mysql"), log
    # Sent again later: the stored result, nothing run.
    assert tasks.book_slot.apply_async(("09:00", 1.0)).get(timeout=60) == first.get()
    assert Booking.objects.count() == 1


def test_a_skipped_duplicate_comes_back_until_the_key_is_free(
    transactional_db: None, tmp_path: Path
) -> None:
    """``duplicates="skip"``: a delivery that finds the key taken raises TaskInProgress,
    and Celery delivers it again later, with its backoff (at most 1, 2, 4, 8... s), until
    the first has finished; it then returns the first one's result. Celery's default limit
    gave up after three retries (7 s at most) while the first still ran: the delivery
    failed, was acknowledged, and was lost."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite: a duplicate waits for the first's write lock, not told at once")
    tasks = celery_tasks()
    with celery_workers(STORES["database"], tmp_path / "worker.log") as start:
        worker = start(pool="prefork", concurrency=2)
        first = tasks.book_slot_or_skip.apply_async(("09:00", 8.0))
        worker.wait_for("event=reserved")  # the first holds the key for 8 s
        duplicate = tasks.book_slot_or_skip.apply_async(("09:00", 8.0))
        assert first.get(timeout=60) == duplicate.get(timeout=60) == Booking.objects.get().pk
    log = worker.log.read_text(errors="replace")
    assert log.count("event=conflict") >= 4, log  # past Celery's default of three retries
    # The first's result, once: a retry whose countdown outlasts the broker's visibility
    # timeout (3 s here) may be handed out twice, and both copies are replayed.
    assert log.count("event=stored") == 1 and "event=replayed" in log, log
    assert Booking.objects.count() == 1


def test_a_task_whose_worker_was_killed_is_redelivered_and_runs_once(
    celery_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    tasks = celery_tasks()
    started = tmp_path / "started"
    worker = celery_worker()
    sent = tasks.book.apply_async(("09:00", str(started), 60.0), {"idempotency_key": "order-1"})
    servers.wait_until(started.exists, worker.process, what="the task", seconds=60)
    worker.kill()  # mid-task, its row written but not committed: acks_late keeps the message
    assert Booking.objects.count() == 0

    celery_worker()  # the broker delivers the task again to the new worker
    result = sent.get(timeout=90)
    assert result == {"booking": Booking.objects.get().pk, "slot": "09:00"}
    again = tasks.book.apply_async(("09:00", str(started), 60.0), {"idempotency_key": "order-1"})
    assert again.get(timeout=60) == result
    assert Booking.objects.count() == 1


# -- after the COMMIT: the result is stored by the first hook, ahead of the task's ------

#: A short LOCK_TIMEOUT, renewed by the heartbeat or not.
AFTER_COMMIT_STORES: dict[str, dict[str, object]] = {
    "database": STORES["database"],
    "redis": {**STORES["redis"], "LOCK_TIMEOUT": 2},
    "redis-heartbeat": {**STORES["redis"], "LOCK_TIMEOUT": 2, "HEARTBEAT": 0.5},
}
RABBITMQ_URL = os.environ.get("TESTS_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def skip_on_other_databases(store: str) -> None:
    """The Redis store's cases do not depend on the database: run on PostgreSQL only (CI time)."""
    if store != "database" and connection.vendor not in ("postgresql",):
        pytest.skip("the Redis store's worker cases run on PostgreSQL")


def sender(broker: str) -> Any:
    """A Celery app of the test's own that sends by name through ``broker``."""
    from celery import Celery

    from tests.celery_app import QUEUE

    app = Celery("sender", broker=broker, backend=REDIS_URL)
    app.conf.update(task_default_queue=QUEUE, broker_connection_retry_on_startup=True)
    app.control.purge()  # nothing left by an earlier run
    return app


@pytest.mark.parametrize(
    ("broker", "store"),
    [
        ("redis", "database"),
        ("redis", "redis"),
        ("redis", "redis-heartbeat"),
        ("rabbitmq", "redis-heartbeat"),
    ],
)
def test_a_worker_killed_in_a_hook_after_the_commit_does_not_run_the_task_again(
    broker: str, store: str, transactional_db: None, tmp_path: Path
) -> None:
    """SIGKILL in the task's own on_commit hook (an e-mail), after its COMMIT: the
    broker delivers the task again, and the redelivery returns the stored result."""
    skip_on_other_databases(store)
    url = RABBITMQ_URL if broker == "rabbitmq" else REDIS_URL
    started = tmp_path / "started"
    with celery_workers(AFTER_COMMIT_STORES[store], tmp_path / "worker.log", url) as start:
        worker = start(pool="prefork")
        sent = sender(url).send_task(
            "tests.celery_tasks.book_then_notify",
            ("09:00", str(started), 60.0),
            {"idempotency_key": "order-1"},
        )
        servers.wait_until(started.exists, worker.process, what="the hook", seconds=60)
        worker.kill()
        assert Booking.objects.count() == 1  # committed before its hook ran
        start(pool="prefork")  # the broker delivers the task again to the new worker
        assert sent.get(timeout=90) == Booking.objects.get().pk
    assert Booking.objects.count() == 1


def test_a_hook_slower_than_lock_timeout_keeps_the_key(
    transactional_db: None, tmp_path: Path
) -> None:
    """No crash: a 4 s hook, LOCK_TIMEOUT 2 s, a duplicate 1 s into the hook."""
    skip_on_other_databases("redis")
    started = tmp_path / "started"
    with celery_workers(AFTER_COMMIT_STORES["redis"], tmp_path / "worker.log") as start:
        worker = start(pool="prefork", concurrency=2)
        tasks = celery_tasks()
        first = tasks.book_then_notify.apply_async(
            ("09:00", str(started), 4.0), {"idempotency_key": "order-1"}
        )
        servers.wait_until(started.exists, worker.process, what="the hook", seconds=60)
        time.sleep(1)
        duplicate = tasks.book_then_notify.apply_async(
            ("09:00", str(started), 4.0), {"idempotency_key": "order-1"}
        )
        assert duplicate.get(timeout=60) == first.get(timeout=60) == Booking.objects.get().pk
    assert Booking.objects.count() == 1


def test_uuid_datetime_and_decimal_arguments_and_results_through_a_worker(
    transactional_db: None, tmp_path: Path
) -> None:
    """kombu's JSON hands them to the task as objects: fingerprinted, stored, replayed."""
    order, at = uuid.uuid4(), datetime(2026, 12, 5, 9, 30, tzinfo=UTC)
    with celery_workers(STORES["database"], tmp_path / "worker.log") as start:
        start()
        tasks = celery_tasks()
        sent = [tasks.book_order.delay(order, at, Decimal("10.50")) for _ in range(2)]
        results = [result.get(timeout=60) for result in sent]
    expected = {"booking": Booking.objects.get().pk, "order": order, "at": at}
    assert results == [{**expected, "amount": Decimal("21.00")}] * 2


# -- Django's tasks framework (django.tasks, or the django-tasks backport) ----------


def run_db_workers(count: int, tmp_path: Path) -> None:
    """``db_worker --batch`` in ``count`` processes at once, until the queue is empty."""
    command = [sys.executable, "-m", "django", "db_worker", "--batch", "--no-startup-delay"]
    env = worker_env({"STORE": "database"})
    workers = [Worker(command, env, tmp_path / f"db_worker-{i}.log") for i in range(count)]
    for worker in workers:
        assert worker.process.wait(timeout=120) == 0, worker.log.read_text(errors="replace")


@pytest.fixture
def django_tasks(transactional_db: None):  # type: ignore[no-untyped-def]
    pytest.importorskip("django_tasks_db")
    from tests import django_tasks_app

    return django_tasks_app


def test_a_framework_task_enqueued_twice_runs_once(django_tasks, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    results = [
        django_tasks.book.enqueue("09:00", idempotency_key="order-1"),
        django_tasks.book.enqueue("09:00", idempotency_key="order-1"),
        django_tasks.book.enqueue("10:00", idempotency_key="order-2"),
        django_tasks.book_slot.enqueue("11:00"),
        django_tasks.book_slot.enqueue("11:00"),
    ]
    run_db_workers(1, tmp_path)
    for result in results:
        result.refresh()
    assert [result.status.name for result in results] == ["SUCCESSFUL"] * 5
    values = [result.return_value for result in results]
    assert values[0] == values[1] != values[2]
    assert values[3] == values[4]
    assert Booking.objects.count() == 3


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent workers: PostgreSQL")
def test_framework_duplicates_on_two_workers_at_once_run_once(django_tasks, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    results = [
        django_tasks.book.enqueue("09:00", pause=1.0, idempotency_key="order-1") for _ in range(2)
    ]
    run_db_workers(2, tmp_path)
    for result in results:
        result.refresh()
    assert [result.status.name for result in results] == ["SUCCESSFUL"] * 2
    # They ran at the same time: the duplicate waited for the first, then returned its result.
    first, second = sorted(results, key=lambda result: result.finished_at)
    assert second.started_at < first.finished_at
    assert results[0].return_value == results[1].return_value
    assert Booking.objects.count() == 1
