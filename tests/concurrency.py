"""Run real requests from real threads, each with its own client and connections."""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, connections
from django.test import Client


@contextlib.contextmanager
def default_database(**changes: Any) -> Iterator[None]:
    """The default database with ``changes``, for the connections opened from now on
    (every thread's, and this one's after it is closed here); as it was afterwards."""
    database = connections.settings["default"]
    saved = copy.deepcopy(database)
    connection.close()
    database.update(changes)
    try:
        yield
    finally:
        connection.close()
        database.clear()
        database.update(saved)


def logged_in_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def in_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Start ``count`` threads at the same moment; return each one's result (or exception)."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = work(index)
        except BaseException as exc:  # reported to the test, not swallowed
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


class Background:
    """One request running in a thread while the test does something else."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.result: Any = None
        self._work = work
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            self.result = self._work()
        except BaseException as exc:
            self.result = exc
        finally:
            connections.close_all()

    def start(self) -> Background:
        self._thread.start()
        return self

    def is_running(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> Any:
        self._thread.join(timeout=60)
        return self.result
