"""Idempotent task functions for the task tests: each run writes one Booking row.

Module-level, so a queue's worker process imports them by name.
"""

from __future__ import annotations

import time

from idempotency_django.tasks import idempotent_task
from tests.testapp.models import Booking


@idempotent_task
def book(slot: str, pause: float = 0.0) -> dict[str, object]:
    """Book ``slot``: the key is the caller's ``idempotency_key``."""
    booking = Booking.objects.create(slot=slot)
    time.sleep(pause)
    return {"booking": booking.pk, "slot": slot}


@idempotent_task(key=lambda slot, **_: f"slot-{slot}")
def book_slot(slot: str) -> int:
    """Book ``slot`` once per slot: the key is made from the arguments."""
    return Booking.objects.create(slot=slot).pk


class Refused(Exception):
    pass


@idempotent_task
def book_then_fail(slot: str) -> None:
    """Write, then fail: the write must not stay, and the key must be free again."""
    Booking.objects.create(slot=slot)
    raise Refused(slot)


@idempotent_task
def book_and_return_an_object(slot: str) -> object:
    Booking.objects.create(slot=slot)
    return object()


def fail(reason: str) -> None:
    """Raise :class:`Refused` (from a lambda, a hook, or a task's body)."""
    raise Refused(reason)
