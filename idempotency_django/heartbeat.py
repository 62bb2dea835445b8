"""``HEARTBEAT``: running requests' reservations renewed in the background.

Without it a reservation lives ``LOCK_TIMEOUT`` from its claim, which must
therefore outlast the slowest view, and a crashed request holds its key that
long (5 minutes by default). With it, one thread per process renews every
running reservation each ``HEARTBEAT`` seconds, so ``LOCK_TIMEOUT`` can be a
few seconds: a slow view keeps its key, a crashed one frees it quickly.
``MAX_RUN_TIME`` bounds a stuck one: its reservation is no longer renewed.

Only reservations committed on their own are renewed: one made in the
request's transaction is invisible to other requests until that commits, and
a crash rolls it back with the rest.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import close_old_connections

from idempotency_django.conf import idempotency_settings
from idempotency_django.stores import StoreUnavailable
from idempotency_django.stores.base import BaseStore, RecordKey, RequestInfo

logger = logging.getLogger("idempotency_django")


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
    stopped: bool = False
    #: Held while renewing: the request settles its key (complete, release)
    #: under it, so no renewal can bring back a reservation it just released.
    lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self.lock:
            yield

    def stop(self) -> None:
        self.stopped = True

    def renew(self) -> bool:
        """Renew once; False when this beat is over (stopped, lost or past its deadline)."""
        with self.lock:
            if self.stopped or time.monotonic() >= self.deadline:
                return False
            try:
                owned = self.store.renew(self.key, self.token, self.lock_timeout, self.info)
            except StoreUnavailable as exc:
                # Tried again next beat; the reservation lives LOCK_TIMEOUT meanwhile.
                logger.warning(
                    "idempotency event=heartbeat_failed key_digest=%s error=%s",
                    self.key.digest[:16],
                    type(exc.__cause__ or exc).__name__,
                )
                return True
            if not owned:
                logger.warning(
                    "idempotency event=heartbeat_lost key_digest=%s", self.key.digest[:16]
                )
            return owned


class Heartbeat:
    """The process's renewing thread and the beats it renews."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._beats: set[Beat] = set()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def start(
        self, store: BaseStore, key: RecordKey, token: str, info: RequestInfo, lock_timeout: int
    ) -> Beat:
        deadline = time.monotonic() + idempotency_settings.MAX_RUN_TIME
        beat = Beat(store, key, token, info, lock_timeout, deadline)
        with self._lock:
            self._beats.add(beat)
            if self._thread is None or self._pid != os.getpid():
                # First use in this process (a forked worker inherits no thread).
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._run, name="idempotency-heartbeat", daemon=True
                )
                self._thread.start()
        return beat

    def _run(self) -> None:
        while True:
            interval = idempotency_settings.HEARTBEAT or 1.0
            self._wake.wait(interval)
            with self._lock:
                beats = [beat for beat in self._beats if not beat.stopped]
                self._beats = set(beats)
            if not beats:
                continue
            try:
                over = [beat for beat in beats if not beat.renew()]
            finally:
                # This thread's database connections, as after a request:
                # none is held between beats unless CONN_MAX_AGE keeps it.
                close_old_connections()
            with self._lock:
                self._beats.difference_update(over)


#: The process's heartbeat.
heartbeat = Heartbeat()


def start_beat(
    store: BaseStore, key: RecordKey, token: str, info: RequestInfo, lock_timeout: int
) -> Beat | None:
    """Renew this reservation in the background, if ``HEARTBEAT`` is on."""
    if not idempotency_settings.HEARTBEAT:
        return None
    return heartbeat.start(store, key, token, info, lock_timeout)
