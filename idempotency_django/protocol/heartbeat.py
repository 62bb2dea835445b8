"""``HEARTBEAT``: running requests' reservations renewed in the background.

One thread per process renews every running reservation each ``HEARTBEAT``
seconds, so ``LOCK_TIMEOUT`` can be a few seconds: a slow view keeps its key, a
crashed one frees it quickly. ``MAX_RUN_TIME`` bounds a stuck one. A renewal
never remakes a reservation completed, released or taken over meanwhile
(``remake=False``), and never waits for a row another transaction holds (a
retry's takeover): one blocked renewal would hold up all the others. Only
reservations committed on their own are renewed, and only while ``fate_open``:
one whose work rolled back is left to expire like a crashed one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import ParamSpec

from django.db import close_old_connections

from idempotency_django.conf import DEFAULT_MAX_RUN_TIME, idempotency_settings
from idempotency_django.protocol.logs import emit, error_name
from idempotency_django.stores import StoreUnavailable
from idempotency_django.stores.base import BaseStore, RecordKey, RequestInfo

P = ParamSpec("P")


def _interval() -> float:
    """Seconds between renewals, as set now (a test may change it while beats run)."""
    setting = idempotency_settings.HEARTBEAT
    return float(setting.interval) if setting is not None and setting.interval > 0 else 1.0


@dataclass(eq=False)
class Beat:
    """One running reservation, renewed until :meth:`stop` or ``MAX_RUN_TIME``."""

    store: BaseStore
    key: RecordKey
    token: str
    info: RequestInfo
    lock_timeout: int
    #: False once the transaction the completion waits for has ended without it.
    fate_open: Callable[[], bool] | None = None
    stopped: bool = False
    #: Its holder is completing or releasing it now: a renewal that finds it
    #: settled meanwhile lost nothing.
    settling: bool = False
    #: ``time.monotonic()`` of the next renewal, and past which there is none.
    due: float = field(init=False)
    deadline: float = field(init=False)

    def __post_init__(self) -> None:
        now, setting = time.monotonic(), idempotency_settings.HEARTBEAT
        self.due = now + _interval()
        self.deadline = now + (setting.max_run_time if setting else DEFAULT_MAX_RUN_TIME)

    def stop(self) -> None:
        self.stopped = True

    def renew(self) -> bool:
        """Renew once; False once this beat is over (stopped, settled, lost, past its deadline)."""
        if self.stopped or time.monotonic() >= self.deadline:
            return False
        self.due = time.monotonic() + _interval()
        try:
            if self.fate_open is not None and not self.fate_open():
                return False  # its work rolled back: left to expire, as a crashed one is
            owned = self.store.renew(
                self.key, self.token, self.lock_timeout, self.info, remake=False
            )
        except StoreUnavailable as exc:
            # Tried again next beat; the reservation lives LOCK_TIMEOUT meanwhile.
            # Its holder completing it holds its row: nothing failed then.
            if not self.settling:
                self.log(logging.WARNING, "heartbeat_failed", error=error_name(exc))
            return True
        except Exception:  # a store's own error must not end every renewal of the process
            self.log(logging.ERROR, "heartbeat_failed", exc_info=True)
            return True
        if not owned and not self.settling and not self.stopped:
            self.log(logging.WARNING, "heartbeat_lost")
        return owned

    def log(self, level: int, event: str, exc_info: bool = False, **fields: str) -> None:
        emit(
            level, {"event": event, "key_digest": self.key.digest[:16], **fields}, exc_info=exc_info
        )


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
        beat = Beat(store, key, token, info, lock_timeout, fate_open)
        with self._lock:
            self._beats.add(beat)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="idempotency-heartbeat", daemon=True
                )
                self._thread.start()
        self._added.set()  # the thread may be waiting for a later beat, or for none
        return beat

    def _run(self) -> None:
        while True:
            with self._lock:
                self._beats = {beat for beat in self._beats if not beat.stopped}
                first_due = min((beat.due for beat in self._beats), default=None)
            self._added.wait(None if first_due is None else max(0.0, first_due - time.monotonic()))
            self._added.clear()
            now = time.monotonic()
            with self._lock:
                due = [beat for beat in self._beats if beat.due <= now and not beat.stopped]
            for beat in due:
                if not beat.renew():
                    beat.stop()  # dropped from the beats at the next wake
            # This thread's database connections, as after a request: none is
            # held between beats unless CONN_MAX_AGE keeps it.
            close_old_connections()
            took = time.monotonic() - now
            if took > _interval():
                fields = {"event": "heartbeat_slow", "beats": len(due), "seconds": f"{took:.1f}"}
                emit(logging.WARNING, fields)


def renewal_grace() -> timedelta:
    """How long past its takeover time a reservation may still be renewed, so not purged.

    A process that stalled past ``LOCK_TIMEOUT`` (a GC pause, a paused VM)
    renews its expired reservation when it runs again; purged, every retry would
    run the work again. No beat renews past ``MAX_RUN_TIME`` after its claim.
    """
    setting = idempotency_settings.HEARTBEAT
    return timedelta(seconds=int(setting.max_run_time) if setting else 0)


#: The process's heartbeat; a forked child starts with none of its parent's beats.
heartbeat = Heartbeat()
os.register_at_fork(after_in_child=lambda: Heartbeat.__init__(heartbeat))


def _when_on(start: Callable[P, Beat]) -> Callable[P, Beat | None]:
    def start_beat(*args: P.args, **kwargs: P.kwargs) -> Beat | None:
        """Renew this reservation in the background, if ``HEARTBEAT`` is on."""
        return None if idempotency_settings.HEARTBEAT is None else start(*args, **kwargs)

    return start_beat


start_beat = _when_on(heartbeat.start)
