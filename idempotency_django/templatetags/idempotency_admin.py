"""Template filters of the idempotency records' admin pages."""

from __future__ import annotations

from typing import Any

from django import template
from django.db import models
from django.db.models import QuerySet

from idempotency_django.admin.actions import live_reservation_count

register = template.Library()


@register.filter
def live_reservations(records: models.Model | QuerySet[Any]) -> int:
    """``{{ object|live_reservations }}``, ``{{ queryset|live_reservations }}``: see
    :func:`~idempotency_django.admin.actions.live_reservation_count`."""
    return live_reservation_count(records)
