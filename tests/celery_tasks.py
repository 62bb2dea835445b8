"""The Celery tasks of tests/test_task_workers.py: each run writes one Booking row."""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from django.db import transaction

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


@shared_task(bind=True, key=lambda slot, *_args, **_kwargs: f"slot-{slot}")
def book_slot(self: object, slot: str, pause: float = 0.0) -> int:
    """A bound task keyed by its argument; ``pause`` keeps it running for duplicates."""
    pk = Booking.objects.create(slot=slot).pk
    time.sleep(pause)
    return pk


@shared_task(key=lambda slot, *_args: f"slot-{slot}", duplicates="skip")
def book_slot_or_skip(slot: str, pause: float = 0.0) -> int:
    """A duplicate while it runs raises TaskInProgress at once instead of waiting."""
    pk = Booking.objects.create(slot=slot).pk
    time.sleep(pause)
    return pk


@shared_task(key=lambda order, *_: f"order-{order}")
def book_order(order: uuid.UUID, at: datetime, amount: Decimal) -> dict[str, object]:
    """Arguments and a result of the types kombu's JSON hands back as objects."""
    booking = Booking.objects.create(slot=f"{order}@{at.isoformat()}")
    return {"booking": booking.pk, "order": order, "at": at, "amount": amount * 2}


@shared_task(serializer="pickle")
def book_pickled(slot: object) -> int:
    """Pickle sends any argument; the fingerprint cannot hold every one."""
    return Booking.objects.create(slot=str(slot)).pk


@shared_task
def book_then_notify(slot: str, started: str = "", pause: float = 0.0) -> int:
    """Book ``slot``; after the COMMIT a hook (an e-mail) says so in ``started``, then pauses."""
    pk = Booking.objects.create(slot=slot).pk

    def notify() -> None:
        if started and not Path(started).exists():
            Path(started).touch()  # committed: a kill now must not run the booking again
            time.sleep(pause)

    transaction.on_commit(notify)
    return pk
