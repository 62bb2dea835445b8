"""``HEARTBEAT``: running requests' reservations renewed in the background.

Without it a reservation lives ``LOCK_TIMEOUT`` from its claim, which must
therefore outlast the slowest view, and a crashed request holds its key that
long (5 minutes by default). With it, one thread per process renews every
running reservation each ``HEARTBEAT`` seconds, so ``LOCK_TIMEOUT`` can be a
few seconds: a slow view keeps its key, a crashed one frees it quickly.
``HEARTBEAT``'s ``MAX_RUN_TIME`` bounds a stuck one: its reservation is no longer renewed.

A renewal only extends a reservation that is still there
(``renew(..., remake=False)``): one completed, released or taken over
meanwhile is left as it is, so the thread needs no lock shared with the
requests. Only reservations committed on their own are renewed: one made in
the request's transaction is invisible to other requests until that commits,
and a crash rolls it back with the rest. And only while their fate is open:
a reservation whose completion waits for a transaction that rolled back is
left to expire (``fate_open``), never renewed to ``MAX_RUN_TIME``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.db import close_old_connections

from idempotency_django.conf import DEFAULT_MAX_RUN_TIME, idempotency_settings
from idempotency_django.protocol.logs import emit, error_name
from idempotency_django.stores import StoreUnavailable
from idempotency_django.stores.base import BaseStore, RecordKey, RequestInfo


def _interval() -> float:
    """Seconds between renewals, as set now (a test may change it while beats run)."""
    setting = idempotency_settings.HEARTBEAT
    return float(setting.interval) if setting is not None and setting.interval > 0 else 1.0


@dataclass(eq=False)
class Beat:
    """One running reservation, renewed until :meth:`stop` or its deadline."""

    store: BaseStore
    key: RecordKey
    token: str
    info: RequestInfo
    lock_timeout: int
    #: ``time.monotonic()`` after which it is no longer renewed (MAX_RUN_TIME).
    deadline: float
    #: ``time.monotonic()`` of its next renewal: ``HEARTBEAT`` after its start or last one.
    due: float
    #: False once the transaction the completion waits for has ended without it.
    fate_open: Callable[[], bool] | None = None
    stopped: bool = False
    #: Its holder is completing or releasing it now: a renewal that finds it
    #: settled meanwhile lost nothing.
    settling: bool = False

    def stop(self) -> None:
        self.stopped = True

    def renew(self) -> bool:
        """Renew once; False once this beat is over (stopped, settled, lost, past its deadline)."""
        if self.stopped or time.monotonic() >= self.deadline:
            return False
        if self.fate_open is not None and not self.fate_open():
            return False  # its work rolled back: left to expire, as a crashed one is
        self.due = time.monotonic() + _interval()
        try:
            owned = self.store.renew(
                self.key, self.token, self.lock_timeout, self.info, remake=False
            )
        except StoreUnavailable as exc:
            # Tried again next beat; the reservation lives LOCK_TIMEOUT meanwhile.
            self.log("heartbeat_failed", error=error_name(exc))
            return True
        if not owned and not self.settling and not self.stopped:
            self.log("heartbeat_lost")
        return owned

    def log(self, event: str, **fields: str) -> None:
        emit(logging.WARNING, {"event": event, "key_digest": self.key.digest[:16], **fields})


class Heartbeat:
    """The process's renewing thread and the beats it renews, each when it is due."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._beats: set[Beat] = set()
        self._added = threading.Event()
        self._thread: threading.Thread | None = None

    def start(
        self,
        store: BaseStore,
        key: RecordKey,
        token: str,
        info: RequestInfo,
        lock_timeout: int,
        fate_open: Callable[[], bool] | None = None,
    ) -> Beat:
        now = time.monotonic()
        setting = idempotency_settings.HEARTBEAT
        deadline = now + (setting.max_run_time if setting is not None else DEFAULT_MAX_RUN_TIME)
        beat = Beat(
            store,
            key,
            token,
            info,
            lock_timeout,
            deadline,
            due=now + _interval(),
            fate_open=fate_open,
        )
        with self._lock:
            self._beats.add(beat)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="idempotency-heartbeat", daemon=True
                )
                self._thread.start()
        self._added.set()  # the thread may be waiting for a later beat, or for none
        return beat

    def forget_all(self) -> None:
        """In a forked child: the parent's beats and thread are not this process's."""
        self._lock = threading.Lock()
        self._beats = set()
        self._added = threading.Event()
        self._thread = None

    def _run(self) -> None:
        while True:
            with self._lock:
                self._beats = {beat for beat in self._beats if not beat.stopped}
                first_due = min((beat.due for beat in self._beats), default=None)
            wait = None if first_due is None else max(0.0, first_due - time.monotonic())
            self._added.wait(wait)
            self._added.clear()
            now = time.monotonic()
            with self._lock:
                due = [beat for beat in self._beats if beat.due <= now and not beat.stopped]
            if not due:
                continue
            over = [beat for beat in due if not self._renewed(beat)]
            with self._lock:
                self._beats.difference_update(over)
            # This thread's database connections, as after a request: none is
            # held between beats unless CONN_MAX_AGE keeps it.
            close_old_connections()
            took = time.monotonic() - now
            if took > _interval():
                fields = {"event": "heartbeat_slow", "beats": len(due), "seconds": f"{took:.1f}"}
                emit(logging.WARNING, fields)

    @staticmethod
    def _renewed(beat: Beat) -> bool:
        try:
            return beat.renew()
        except Exception:  # a store's own error must not end every renewal of the process
            fields = {"event": "heartbeat_failed", "key_digest": beat.key.digest[:16]}
            emit(logging.ERROR, fields, exc_info=True)
            beat.due = time.monotonic() + _interval()
            return True


def renewal_grace() -> timedelta:
    """How long past its takeover time a reservation may still be renewed by a heartbeat.

    With ``HEARTBEAT`` on, a request whose process stalled for longer than
    ``LOCK_TIMEOUT`` (a long GC pause, a CPU-bound thread holding the GIL, a
    paused VM) renews its expired reservation once it runs again, unless a
    retry took the key over meanwhile. Purged, the row is gone: the renewal
    finds nothing (it never remakes a reservation), and every retry for the
    rest of the run would run the work again. No beat renews past
    ``MAX_RUN_TIME`` after its claim, so a reservation expired that long ago
    is truly abandoned. Without the heartbeat nothing renews: no grace.
    """
    setting = idempotency_settings.HEARTBEAT
    if setting is None:
        return timedelta(0)
    return timedelta(seconds=int(setting.max_run_time))


#: The process's heartbeat.
heartbeat = Heartbeat()
os.register_at_fork(after_in_child=heartbeat.forget_all)


def start_beat(
    store: BaseStore,
    key: RecordKey,
    token: str,
    info: RequestInfo,
    lock_timeout: int,
    fate_open: Callable[[], bool] | None = None,
) -> Beat | None:
    """Renew this reservation in the background, if ``HEARTBEAT`` is on."""
    if idempotency_settings.HEARTBEAT is None:
        return None
    return heartbeat.start(store, key, token, info, lock_timeout, fate_open)
