"""Waiting for a key a running request holds: :class:`Busy`, and how many may wait.

With ``WAIT_FOR_IN_PROGRESS``, a duplicate of a running request waits for its
answer instead of getting ``409 idempotency_key_in_progress``. Under WSGI each
waiter holds a worker thread, so :func:`waiting_slot` admits one waiter per key
and :data:`WAITERS` in all in this process (threads and event loops alike); any
other duplicate gets its 409 at once. More waiters would only hold more threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.http.response import HttpResponseBase

from idempotency_django.stores import BaseStore, RecordKey, StoreUnavailable
from idempotency_django.stores.base import backoff

#: Duplicates that may wait at once in one process, each for a key of its own.
WAITERS = 2

_lock = threading.Lock()
_waited_for: set[str] = set()


@contextlib.contextmanager
def waiting_slot(key: str) -> Iterator[bool]:
    """Yield whether a duplicate of ``key`` may wait now; its place is kept until exit."""
    with _lock:
        admitted = key not in _waited_for and len(_waited_for) < WAITERS
        if admitted:
            _waited_for.add(key)
    try:
        yield admitted
    finally:
        if admitted:
            with _lock:
                _waited_for.discard(key)


class HeldKey(Protocol):
    """What :class:`Busy` needs of the attempt that found the key held.

    An :class:`~idempotency_django.protocol.attempt.Attempt`, which builds a :class:`Busy`
    (so this module cannot import it).
    """

    key: RecordKey
    store: BaseStore

    def log(self, level: int, event: str, **fields: Any) -> None: ...

    def conflict_in_progress(self) -> HttpResponseBase: ...

    def echo_key(self, response: HttpResponseBase) -> None: ...


@dataclass
class Busy:
    """Phase 1's answer for a key a running request holds, when the view waits for it.

    The driver waits (outside any transaction) until the first request has
    finished or ``seconds`` have passed, then begins again: the retry then
    replays the first request's answer, runs if the first one failed, or gets
    ``409 idempotency_key_in_progress`` after all.
    """

    attempt: HeldKey
    seconds: float

    @contextlib.contextmanager
    def slot(self, seconds: float) -> Iterator[bool]:
        with waiting_slot(self.attempt.key.digest) as admitted:
            if admitted:
                self.attempt.log(logging.DEBUG, "waiting", seconds=round(seconds, 3))
            yield admitted

    def wait(self, seconds: float) -> bool:
        """Wait for the key to settle; False, at once, past the waiters' bound."""
        with self.slot(seconds) as admitted, contextlib.suppress(StoreUnavailable):
            # On a store failure, begin again: the claim then answers 503 if it stays down.
            if admitted:
                self.attempt.store.wait(self.attempt.key, seconds)
        return admitted

    async def await_settled(self, seconds: float) -> bool:
        """:meth:`wait` for async views, sleeping between looks at the store."""
        store, key, deadline = self.attempt.store, self.attempt.key, time.monotonic() + seconds
        with self.slot(seconds) as admitted, contextlib.suppress(StoreUnavailable):
            for pause in backoff() if admitted else ():
                if not await sync_to_async(store.is_held)(key):
                    break
                if (remaining := deadline - time.monotonic()) <= 0:
                    break
                await asyncio.sleep(min(pause, remaining))
        return admitted

    def conflict(self) -> HttpResponseBase:
        response = self.attempt.conflict_in_progress()
        self.attempt.echo_key(response)
        return response
