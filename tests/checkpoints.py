"""Pause a request at a named point of its view, to force an interleaving deterministically.

A test arms a checkpoint, starts a request in a thread, waits until the view
reaches the point, does what must happen in between, and lets the view go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from idempotency_django.stores import database

TIMEOUT = 30.0


class Checkpoint:
    def __init__(self, name: str) -> None:
        self.name = name
        self.reached = threading.Event()
        self.proceed = threading.Event()
        #: What the view told the test when it got here (e.g. its connection's id).
        self.info: dict[str, Any] = {}

    def __enter__(self) -> Checkpoint:
        _armed[self.name] = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.proceed.set()  # never leave a request hanging
        _armed.pop(self.name, None)

    def wait_until_reached(self) -> None:
        if not self.reached.wait(TIMEOUT):
            raise AssertionError(f"the view never reached checkpoint {self.name!r}")

    def release(self) -> None:
        self.proceed.set()


_armed: dict[str, Checkpoint] = {}


def reach(name: str, **info: Any) -> None:
    """Called by a test view: block here while a test holds the checkpoint armed."""
    checkpoint = _armed.get(name)
    if checkpoint is not None:
        checkpoint.info.update(info)
        checkpoint.reached.set()
        checkpoint.proceed.wait(TIMEOUT)


async def reach_async(name: str, **info: Any) -> None:
    """``reach`` for an async view: waits without blocking the event loop."""
    checkpoint = _armed.get(name)
    if checkpoint is not None:
        checkpoint.info.update(info)
        checkpoint.reached.set()
        await asyncio.to_thread(checkpoint.proceed.wait, TIMEOUT)


@contextlib.contextmanager
def before_takeover(action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` once, between a claim's read of an expired row and its takeover UPDATE.

    The database store's real takeover runs right after; only its timing is chosen.
    """
    real = database._take_over
    pending = [action]

    def take_over_after_action(*args: Any, **kwargs: Any) -> bool:
        if pending:
            pending.pop()()
        return real(*args, **kwargs)

    with mock.patch.object(database, "_take_over", take_over_after_action):
        yield
    assert not pending, "no claim reached a takeover"
