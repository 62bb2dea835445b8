"""HEARTBEAT: a running request keeps its key past a short LOCK_TIMEOUT, a settled one does not.

Real threads, the real clock and a real store (the test database; Redis with
``--all``): the first request's view runs past LOCK_TIMEOUT, held at a
checkpoint until a duplicate has been answered; the heartbeat thread is the only thing renewing its
reservation. The same test without the heartbeat shows the takeover it
prevents.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client, override_settings

from idempotency_django.checks import check_settings
from idempotency_django.protocol.heartbeat import Beat, heartbeat
from idempotency_django.protocol.reservation import KeyReservation, Settled
from idempotency_django.stores import (
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
    get_store,
)
from idempotency_django.stores.memory import MemoryStore
from tests.checkpoints import Checkpoint
from tests.concurrency import Background, logged_in_client
from tests.redis_helpers import redis_store_settings
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

BODY = json.dumps({"slot": "2026-07-30T09:00:00Z"})
URL = "/plain/bookings/"
SHORT_LOCK: dict[str, Any] = {"LOCK_TIMEOUT": 1, "HEARTBEAT": 0.2}


def keyed_post(client: Client, url: str, key: str = "booking-hb", pause_at: str = ""):  # type: ignore[no-untyped-def]
    """``pause_at``: the view waits at that checkpoint (a header: not part of the request's
    fingerprint, so the same request without it is a duplicate)."""
    headers = {"X-Pause-At": pause_at} if pause_at else {}
    return client.post(
        url, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key, headers=headers
    )


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "redis":
        with redis_store_settings(**SHORT_LOCK):
            yield request.param
    else:
        with override_settings(IDEMPOTENCY=SHORT_LOCK):
            yield request.param


def duplicate_during_the_first(alice: User, after: float = 2) -> tuple[int, int, str | None]:
    """The first request and a duplicate ``after`` s into its view: their statuses, the
    duplicate's code. The first goes on only once the duplicate has been answered."""
    with Checkpoint("first-running") as running:  # the first's view waits there
        first = Background(
            lambda: keyed_post(logged_in_client(alice), URL, pause_at="first-running")
        ).start()
        running.wait_until_reached()
        time.sleep(after)  # past LOCK_TIMEOUT (1 s)
        duplicate = keyed_post(logged_in_client(alice), URL)
    code = duplicate.json().get("code") if duplicate.status_code == 409 else None
    return first.join().status_code, duplicate.status_code, code


def test_a_slow_view_keeps_its_key_past_lock_timeout(alice: User, store: str) -> None:
    first, duplicate, code = duplicate_during_the_first(alice)
    assert (first, duplicate, code) == (201, 409, "idempotency_key_in_progress")
    assert Booking.objects.count() == 1
    replay = keyed_post(logged_in_client(alice), URL)
    assert replay.status_code == 201 and replay["Idempotency-Replayed"] == "true"


@override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 1})
def test_without_the_heartbeat_the_same_duplicate_takes_the_key_over(alice: User) -> None:
    """What the heartbeat prevents: LOCK_TIMEOUT shorter than the view, the work runs twice."""
    first, duplicate, _ = duplicate_during_the_first(alice)
    assert (first, duplicate) == (201, 201)
    assert Booking.objects.count() == 2


@override_settings(
    IDEMPOTENCY={
        **SHORT_LOCK,
        "HEARTBEAT": {"INTERVAL": SHORT_LOCK["HEARTBEAT"], "MAX_RUN_TIME": 1},
    }
)
def test_a_request_past_max_run_time_is_no_longer_renewed(alice: User) -> None:
    """MAX_RUN_TIME bounds a stuck request: renewed 1 s, then lost LOCK_TIMEOUT later.

    The last renewal is at most 1 s after the claim, so the key is free by 2 s;
    the duplicate comes at 2.8 s, the first request still running.
    """
    first, duplicate, _ = duplicate_during_the_first(alice, 2.8)
    assert (first, duplicate) == (201, 201)


def test_a_released_key_is_not_brought_back_by_a_late_renewal(alice: User, store: str) -> None:
    """A 400 after several renewals releases the key: a retry runs at once, no 409."""
    url = "/plain/bookings/?delay=0.7&status=400"
    assert keyed_post(logged_in_client(alice), url).status_code == 400
    time.sleep(0.5)  # a renewal racing the release would have re-made the reservation by now
    retry = keyed_post(logged_in_client(alice), url)
    assert retry.status_code == 400 and "Idempotency-Replayed" not in retry
    assert Booking.objects.count() == 2


def test_settled_requests_leave_nothing_to_renew(alice: User, store: str) -> None:
    for number in range(3):
        url = "/plain/bookings/?delay=0.5"
        assert keyed_post(logged_in_client(alice), url, f"hb-{number}").status_code == 201
    time.sleep(0.5)  # one beat
    assert not [beat for beat in heartbeat._beats if not beat.stopped]


@pytest.mark.parametrize(
    ("settings", "check", "message"),
    [
        ({"HEARTBEAT": 0}, "E024", "above 0"),
        ({"HEARTBEAT": "2"}, "E004", "must be None, a number of seconds, or a dict"),
        ({"HEARTBEAT": {"MAX_RUN_TIME": 60}}, "E004", "a dict of INTERVAL"),
        ({"HEARTBEAT": {"INTERVAL": 1, "MAX_RUN_TIME": 1.5}}, "E004", "(whole seconds)"),
        ({"HEARTBEAT": {"INTERVAL": 1, "MAX_RUN_TIME": 0}}, "E024", "MAX_RUN_TIME above 0"),
        ({"HEARTBEAT": {"INTERVAL": 1, "MAX_RUN_TIME": 10**11}}, "E025", "at most"),
        ({"HEARTBEAT": 2, "LOCK_TIMEOUT": 5}, "E028", "at most a third of LOCK_TIMEOUT"),
    ],
)
def test_a_heartbeat_that_cannot_keep_the_key_is_a_configuration_error(
    settings: dict[str, object], check: str, message: str
) -> None:
    with override_settings(IDEMPOTENCY=settings):
        errors = check_settings()
    assert [e.id for e in errors] == [f"idempotency_django.{check}"]
    assert message in errors[0].msg


class FailingOnce(MemoryStore):
    """A store whose renewal fails once with an error of its own (not StoreUnavailable)."""

    failed = False

    def renew(self, *args: Any, **kwargs: Any) -> bool:
        if not self.failed:
            FailingOnce.failed = True
            raise RuntimeError("a store's own bug")
        return super().renew(*args, **kwargs)


@override_settings(IDEMPOTENCY={"HEARTBEAT": 0.1, "LOCK_TIMEOUT": 1})
def test_a_store_error_ends_no_renewal_of_the_process(caplog: pytest.LogCaptureFixture) -> None:
    """One renewal raises something unexpected: the thread goes on renewing every beat,
    and the ERROR record carries the traceback for the operator."""
    store, info = FailingOnce(), RequestInfo(method="POST", path="/", fingerprint="f" * 64)
    key = RecordKey("auth.user:1", "", "survivor")
    token = store.claim(key, info, 1).token
    with caplog.at_level(logging.ERROR, logger="idempotency_django"):
        beat = heartbeat.start(store, key, token, info, 1)
        try:
            time.sleep(1.5)  # past LOCK_TIMEOUT: only renewals after the failure keep it
            assert FailingOnce.failed and store.is_held(key)
        finally:
            beat.stop()
    failed = [r for r in caplog.records if "heartbeat_failed" in r.getMessage()]
    assert len(failed) == 1
    assert failed[0].exc_info is not None and failed[0].exc_info[0] is not None


@contextlib.contextmanager
def purging_every_few_tenths_of_a_second() -> Iterator[None]:
    """The purge in a loop, in a process of its own with the same IDEMPOTENCY settings (as
    cron runs it on another server)."""
    loop = (
        "import django, json, os, time\n"
        "django.setup()\n"
        "from django.test.utils import override_settings\n"
        "from idempotency_django.purge import purge\n"
        "override_settings(IDEMPOTENCY=json.loads(os.environ['IDEMPOTENCY_JSON'])).enable()\n"
        "while True:\n"
        "    purge()\n"
        "    time.sleep(0.3)\n"
    )
    environment = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "TESTS_DB_NAME": str(connection.settings_dict["NAME"]),
        "IDEMPOTENCY_JSON": json.dumps(getattr(settings, "IDEMPOTENCY", {})),
    }
    root = Path(__file__).resolve().parent.parent
    purger = subprocess.Popen([sys.executable, "-c", loop], cwd=root, env=environment)
    try:
        time.sleep(1.5)  # started: Django set up, purging
        yield
    finally:
        purger.kill()
        purger.wait()


def stall_this_process(seconds: float) -> None:
    """Hold the GIL for ``seconds``, as a CPU-bound thread, a long GC pause or a paused VM
    does: no other thread of the process (the heartbeat's) runs meanwhile."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(seconds + 30)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    finally:
        sys.setswitchinterval(switch)


@override_settings(
    IDEMPOTENCY={"LOCK_TIMEOUT": 2, "HEARTBEAT": {"INTERVAL": 0.5, "MAX_RUN_TIME": 60}}
)
def test_a_purge_during_a_stall_never_frees_a_running_requests_key(alice: User) -> None:
    """The process stalls longer than LOCK_TIMEOUT while the purge runs; once it runs again,
    its heartbeat renews the reservation. The purge deleted it as abandoned before (the
    renewal then found nothing, and a retry ran the booking a second time)."""
    with Checkpoint("first-running") as running:
        first = Background(
            lambda: keyed_post(logged_in_client(alice), URL, pause_at="first-running")
        ).start()
        running.wait_until_reached()
        with purging_every_few_tenths_of_a_second():
            stall_this_process(4)  # expired by its own clock for 2 s, purges every 0.3 s
            time.sleep(1.5)  # the heartbeat runs again
            duplicate = keyed_post(logged_in_client(alice), URL)
    assert duplicate.status_code == 409
    assert duplicate.json()["code"] == "idempotency_key_in_progress"
    assert first.join().status_code == 201
    assert Booking.objects.count() == 1


class Holder(KeyReservation):
    """The least a reservation's holder is: no signals, no log lines."""

    def send(self, signal: Any, **kwargs: Any) -> None:
        pass

    def log(self, level: int, event: str, **fields: Any) -> None:
        pass


def test_a_slow_hook_registered_before_the_claim_runs_after_the_answer_is_stored() -> None:
    """The completion is the first commit hook: while an earlier one (a caller's) runs
    past LOCK_TIMEOUT, a retry is answered from the store, never handed the key."""
    key = RecordKey("auth.user:1", "", "slow-hook")
    request = RequestInfo(method="POST", path="/", fingerprint="f" * 64)
    with override_settings(IDEMPOTENCY={"STORE": "memory", "LOCK_TIMEOUT": 1, "HEARTBEAT": 0.2}):
        store, seen = get_store(), []

        def slow_hook() -> None:
            time.sleep(1.2)  # past LOCK_TIMEOUT, with no renewal if the beat stopped
            seen.append(store.claim(key, request, 1).outcome)  # the retry arrives now

        with transaction.atomic():
            transaction.on_commit(slow_hook)
            first = Holder(key, request, 60)
            assert first.take().outcome is Outcome.CLAIMED and first.beat is not None
            assert first.settle(StoredResponse(201, (), b"ok"), 201) is Settled.KEPT
    assert seen == [Outcome.REPLAY]


@override_settings(
    IDEMPOTENCY={"LOCK_TIMEOUT": 2, "HEARTBEAT": {"INTERVAL": 0.2, "MAX_RUN_TIME": 60}}
)
def test_a_renewal_blocked_by_a_takeover_holds_up_no_other_renewal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A process stalled past LOCK_TIMEOUT, and a retry took one of its keys over inside its
    transaction, which holds that row until the retry's view ends. The beat renewing the
    lost key must not wait for it: the thread renews the process's other keys meanwhile.
    Before, its UPDATE waited on the row, and the other keys expired (a retry of one of
    them would have run its work again)."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite: no row locks; a writer waits for the busy timeout, whoever it is")
    store, info = get_store(), RequestInfo(method="POST", path="/", fingerprint="f" * 64)
    lost, kept = RecordKey("auth.user:1", "", "taken-over"), RecordKey("auth.user:1", "", "kept")
    stale_token = store.claim(lost, info, 1).token
    time.sleep(1.2)  # the stalled holder's reservation expired
    taken, done = threading.Event(), threading.Event()

    def retry_taking_over() -> None:
        try:
            with transaction.atomic():
                assert store.claim(lost, info, 60).outcome is Outcome.CLAIMED
                taken.set()
                done.wait(10)  # the retry's view runs; its row stays locked
        finally:
            connection.close()

    retry = threading.Thread(target=retry_taking_over)
    retry.start()
    beats = []
    try:
        assert taken.wait(10)
        kept_token = store.claim(kept, info, 2).token
        beats = [heartbeat.start(store, lost, stale_token, info, 2)]
        beats.append(heartbeat.start(store, kept, kept_token, info, 2))
        with caplog.at_level(logging.WARNING, logger="idempotency_django"):
            time.sleep(3)  # past the kept key's LOCK_TIMEOUT, the takeover still running
            assert store.is_held(kept)
    finally:
        done.set()
        retry.join()
        for beat in beats:
            beat.stop()
    assert any("heartbeat_failed" in record.getMessage() for record in caplog.records)


class Unavailable(MemoryStore):
    """A store whose every renewal fails as a database's locked row does."""

    def renew(self, *args: Any, **kwargs: Any) -> bool:
        raise StoreUnavailable("the row is locked")


@pytest.mark.parametrize(("settling", "warned"), [(False, True), (True, False)])
def test_a_renewal_that_fails_while_its_holder_completes_is_no_warning(
    caplog: pytest.LogCaptureFixture, settling: bool, warned: bool
) -> None:
    """The holder's completion locks its row for an instant; the renewal that meets it
    failed at nothing. Any other failed renewal is a WARNING, tried again next beat."""
    store, info = Unavailable(), RequestInfo(method="POST", path="/", fingerprint="f" * 64)
    key = RecordKey("auth.user:1", "", "settling")
    beat = Beat(store, key, store.claim(key, info, 5).token, info, 5)
    beat.settling = settling
    with caplog.at_level(logging.WARNING, logger="idempotency_django"):
        assert beat.renew() is True  # tried again at the next beat
    assert any("heartbeat_failed" in r.getMessage() for r in caplog.records) is warned
