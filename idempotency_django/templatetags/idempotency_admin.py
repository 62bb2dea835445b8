"""Template filters of the records' delete confirmations (see ``idempotency_django.admin``)."""

from __future__ import annotations

from typing import Any

from django import template
from django.db import models
from django.db.models import QuerySet
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from idempotency_django.models import IdempotencyRecord
from idempotency_django.purge import database_now, default_database

register = template.Library()

#: How Django's "Delete selected" confirmation names the action its form posts back.
DELETE_SELECTED = '<input type="hidden" name="action" value="delete_selected">'


@register.filter
def live_reservations(records: models.Model | QuerySet[Any]) -> int:
    """How many of ``records`` (``object`` or ``queryset``) are reservations within their
    takeover window, by the database's clock (the one takeovers go by): their requests may
    still be running. A COUNT: a selection may be millions."""
    using = default_database()
    if isinstance(records, models.Model):
        records = type(records)._base_manager.using(using).filter(pk=records.pk)
    live = records.filter(state=IdempotencyRecord.State.IN_PROGRESS)
    return live.filter(expires_at__gt=database_now(using)).count()


@register.filter
def posting_back(page: str, action: str) -> SafeString:
    """Django's confirmation ``page`` with its form posting back ``action`` instead:
    releasing must not turn into evicting. Fails loudly if Django's form changes."""
    if page.count(DELETE_SELECTED) != 1:
        raise RuntimeError("Django's delete confirmation no longer names delete_selected once.")
    return mark_safe(
        page.replace(DELETE_SELECTED, DELETE_SELECTED.replace("delete_selected", escape(action)))
    )
