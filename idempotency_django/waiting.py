"""How many duplicates may wait for a running request, per key and per process.

With ``WAIT_FOR_IN_PROGRESS``, a duplicate of a request still running waits
for its answer instead of getting ``409 idempotency_key_in_progress``. Under
WSGI each waiter holds a worker thread for up to that many seconds, so a few
duplicates of one slow request could hold every thread and make everyone else
queue. :func:`waiting_slot` admits at most ``MAX_WAITERS_PER_KEY`` waiters of
one key and ``MAX_WAITERS`` in all in this process (threads and event loops
alike); any other duplicate is answered its 409 at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator

from idempotency_django.conf import idempotency_settings

_lock = threading.Lock()
_per_key: Counter[str] = Counter()
_total = 0


@contextlib.contextmanager
def waiting_slot(key: str) -> Iterator[bool]:
    """Yield whether a duplicate of ``key`` may wait now; its place is kept until exit."""
    global _total
    per_key, most = idempotency_settings.MAX_WAITERS_PER_KEY, idempotency_settings.MAX_WAITERS
    with _lock:
        admitted = (per_key is None or _per_key[key] < per_key) and (most is None or _total < most)
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
