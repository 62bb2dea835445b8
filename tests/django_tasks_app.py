"""The tasks framework's tasks of tests/test_task_workers.py: each run writes one Booking row."""

from __future__ import annotations

import time

from idempotency_django.contrib.django_tasks import task
from tests.testapp.models import Booking


@task
def book(slot: str, pause: float = 0.0) -> dict[str, object]:
    booking = Booking.objects.create(slot=slot)
    time.sleep(pause)
    return {"booking": booking.pk, "slot": slot}


@task(takes_context=True, key=lambda slot: f"slot-{slot}")
def book_slot(context: object, slot: str) -> int:
    """Keyed by its argument; the framework's context is left out of key and fingerprint."""
    return Booking.objects.create(slot=slot).pk


@task(backend="immediate", key=lambda slot: f"now-{slot}", duplicates="skip")
def book_now(slot: str) -> int:
    """Run by the ImmediateBackend in the caller's transaction; a duplicate is told at once."""
    return Booking.objects.create(slot=slot).pk
