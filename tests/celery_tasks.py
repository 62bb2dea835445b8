"""The Celery tasks of tests/test_task_workers.py: each run writes one Booking row."""

from __future__ import annotations

import time
from pathlib import Path

from idempotency_django.contrib.celery import shared_task
from tests.testapp.models import Booking


@shared_task
def book(slot: str, started: str = "", pause: float = 0.0) -> dict[str, object]:
    """Book ``slot``; the first run writes, says so in the file ``started``, then pauses."""
    booking = Booking.objects.create(slot=slot)
    if started and not Path(started).exists():
        Path(started).touch()  # the row is written (uncommitted): a kill now must lose it
        time.sleep(pause)
    return {"booking": booking.pk, "slot": slot}


# --8<-- [start:celery]
@shared_task(bind=True, key=lambda slot, *_args, **_kwargs: f"slot-{slot}")
def book_slot(self: object, slot: str, pause: float = 0.0) -> int:
    """A bound task keyed by its argument; ``pause`` keeps it running for duplicates."""
    pk = Booking.objects.create(slot=slot).pk
    time.sleep(pause)
    return pk


# --8<-- [end:celery]
