"""Waiting for a key a running request holds: :class:`Busy`, and how many may wait.

With ``WAIT_FOR_IN_PROGRESS``, a duplicate of a request still running waits
for its answer instead of getting ``409 idempotency_key_in_progress``. Under
WSGI each waiter holds a worker thread for up to that many seconds, so a few
duplicates of one slow request could hold every thread and make everyone else
queue. :func:`waiting_slot` admits at most :data:`WAITERS_PER_KEY` waiter of
one key and :data:`WAITERS` in all in this process (threads and event loops
alike); any other duplicate is answered its 409 at once. The bounds are fixed:
a client retrying a slow request is served by one waiter, and more waiters
would only hold more threads.

:class:`Busy` is phase 1's answer when the view waits: the driver
(:mod:`~idempotency_django.protocol.phases`) waits with it, outside any transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.http.response import HttpResponseBase

from idempotency_django.stores import BaseStore, RecordKey, StoreUnavailable
from idempotency_django.stores.base import backoff

#: Duplicates that may wait at once for one key, and in all in one process.
WAITERS_PER_KEY = 1
WAITERS = 2

_lock = threading.Lock()
_per_key: Counter[str] = Counter()
_total = 0


@contextlib.contextmanager
def waiting_slot(key: str) -> Iterator[bool]:
    """Yield whether a duplicate of ``key`` may wait now; its place is kept until exit."""
    global _total
    with _lock:
        admitted = _per_key[key] < WAITERS_PER_KEY and _total < WAITERS
        if admitted:
            _per_key[key] += 1
            _total += 1
    try:
        yield admitted
    finally:
        if admitted:
            with _lock:
                _per_key[key] -= 1
                if _per_key[key] <= 0:
                    del _per_key[key]
                _total -= 1


def waiting() -> tuple[int, int]:
    """(keys waited for, waiters) in this process now: for tests and metrics."""
    with _lock:
        return len(_per_key), _total


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

    def wait(self, seconds: float) -> bool:
        """Wait for the key to settle; False, at once, past the waiters' bound."""
        with waiting_slot(self.attempt.key.digest) as admitted:
            if not admitted:
                return False
            self.attempt.log(logging.DEBUG, "waiting", seconds=round(seconds, 3))
            # On a store failure, begin again: the claim then answers 503 if it stays down.
            with contextlib.suppress(StoreUnavailable):
                self.attempt.store.wait(self.attempt.key, seconds)
        return True

    async def await_settled(self, seconds: float) -> bool:
        """:meth:`wait` for async views, sleeping between looks at the store."""
        with waiting_slot(self.attempt.key.digest) as admitted:
            if not admitted:
                return False
            self.attempt.log(logging.DEBUG, "waiting", seconds=round(seconds, 3))
            store, key = self.attempt.store, self.attempt.key
            deadline = time.monotonic() + seconds
            for pause in backoff():
                try:
                    if not await sync_to_async(store.is_held)(key):
                        break
                except StoreUnavailable:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.sleep(min(pause, remaining))
        return True

    def conflict(self) -> HttpResponseBase:
        response = self.attempt.conflict_in_progress()
        self.attempt.echo_key(response)
        return response
