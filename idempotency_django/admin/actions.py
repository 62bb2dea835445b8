"""Releasing stuck reservations and deleting principals' records: actions confirmed on
Django's own "Delete selected" page.

Each action's first POST returns that page (:func:`confirmation`), its form posting back
to the action; the second does the deletion, where the store writes (never through a
read replica), each record logged in the admin's history.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected
from django.contrib.admin.models import DELETION, LogEntry
from django.db import models, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from idempotency_django.admin.display import principal_usernames, render_principal
from idempotency_django.models import IdempotencyRecord
from idempotency_django.purge import default_database, purge_principal, send_evicted

State = IdempotencyRecord.State

if TYPE_CHECKING:
    _AdminMixin = admin.ModelAdmin[Any]
else:  # a mixin: the admins list it before ModelAdmin in their bases
    _AdminMixin = object


def log_deletions(request: HttpRequest, objects: Sequence[models.Model], message: str) -> None:
    """One admin log entry per object, saying why it went (Django's says nothing)."""
    user_id = request.user.pk
    assert user_id is not None  # the admin's views need a logged-in user
    LogEntry.objects.log_actions(
        user_id=user_id, queryset=objects, action_flag=DELETION, change_message=message
    )


def confirmation(
    model_admin: Any, request: HttpRequest, queryset: QuerySet[Any], action: str, **context: Any
) -> TemplateResponse:
    """Django's "Delete selected" confirmation of ``queryset`` (the records its form posts
    back), for ``action``, with ``context`` on top (the app's template shows it)."""
    response = delete_selected(model_admin, request, queryset)
    assert isinstance(response, TemplateResponse)  # without "post", always the page
    assert response.context_data is not None
    response.context_data.update(action_name=action, **context)
    return response


class RecordActionsMixin(_AdminMixin):
    """Both admins' actions: the requests' lists both, the deliveries' the release only."""

    #: The most principals one "delete all records of" may cover: it is meant
    #: for one person's data, not for emptying the table.
    max_principals_per_deletion = 100

    @admin.action(description=_("Release selected stuck reservations"), permissions=["delete"])
    def release_reservations(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> TemplateResponse | None:
        """Delete the selected reservations (after confirmation), so a retry of the key runs.

        Only rows still in progress go: a record that completed meanwhile is kept.
        """
        reservations = queryset.filter(state=State.IN_PROGRESS)
        if not request.POST.get("post"):
            if not reservations.exists():
                message = _(
                    "None of the selected records is a reservation in progress; nothing released."
                )
                self.message_user(request, message, messages.WARNING)
                return None
            return confirmation(
                self,
                request,
                reservations,
                "release_reservations",
                title=_("Release stuck reservations?"),
                skipped_count=queryset.count() - reservations.count(),
            )
        # Where the store writes, never the read alias a router may send
        # the changelist's queryset to (a replica keeps its rows otherwise).
        using = default_database()
        with transaction.atomic(using=using):
            released = list(reservations.using(using).select_for_update())
            if released:
                log_deletions(request, released, "Released stuck reservation.")
                self.model._base_manager.using(using).filter(
                    pk__in=[obj.pk for obj in released], state=State.IN_PROGRESS
                ).delete()
                send_evicted(released, reason="release", user=request.user)
        if not released:
            gone = _("None of the selected records is a reservation.")
            self.message_user(request, gone, messages.WARNING)
            return None
        done = ngettext(
            "Released %(count)d reservation.", "Released %(count)d reservations.", len(released)
        )
        self.message_user(request, done % {"count": len(released)}, messages.SUCCESS)
        return None

    @admin.action(
        description=_("Delete all records of the selected records' principals"),
        permissions=["delete"],
    )
    def delete_principal_records(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> TemplateResponse | None:
        """Delete every record of each selected record's principal, after confirmation.

        For an account deletion or an erasure request: all of the principal's
        records go, live or not, selected or not, in every location.
        """
        principals = sorted(set(queryset.order_by().values_list("principal", flat=True)))
        # Where the store writes: an erasure on a replica would erase nothing.
        using = default_database()
        if len(principals) > self.max_principals_per_deletion:
            too_many = _(
                "The selected records belong to %(count)d principals; select the records "
                "of at most %(most)d at a time."
            )
            most = self.max_principals_per_deletion
            self.message_user(
                request, too_many % {"count": len(principals), "most": most}, messages.ERROR
            )
            return None
        if not request.POST.get("post"):
            # The page lists the principals and how many records of each will go, exactly,
            # in place of the selected records; its form posts the selection back.
            counts = {p: purge_principal(p, using=using, dry_run=True) for p in principals}
            names = principal_usernames(principals)
            listed = [
                format_html(
                    "{}: {}",
                    render_principal(principal, names.get(principal)),
                    ngettext("%(count)d record", "%(count)d records", count) % {"count": count},
                )
                for principal, count in counts.items()
            ]
            return confirmation(
                self,
                request,
                queryset,
                "delete_principal_records",
                title=_("Delete all records of these principals?"),
                deletable_objects=[listed],
                model_count={self.opts.verbose_name_plural: sum(counts.values())}.items(),
                erasing_principals=True,
            )
        deleted = 0
        for principal in principals:
            why = f"Deleted with every record of principal {principal}."
            log = partial(log_deletions, request, message=why)
            deleted += purge_principal(principal, using=using, on_batch=log)
        done = ngettext(
            "Deleted every record of %(principals)d principal (%(count)d in all).",
            "Deleted every record of %(principals)d principals (%(count)d in all).",
            len(principals),
        )
        totals = {"count": deleted, "principals": len(principals)}
        self.message_user(request, done % totals, messages.SUCCESS)
        return None
