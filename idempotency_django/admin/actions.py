"""What staff may do to records beyond viewing them, each after a confirmation page.

Releasing stuck reservations (an action of both admins, and a button on a
request record's page) and deleting every record of principals (an account
deletion, an erasure request). Rows are deleted where the store writes, never
through a read replica, and every deletion is in the admin's log.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db import models, transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from idempotency_django.admin.display import principal_usernames, render_principal
from idempotency_django.models import IdempotencyRecord
from idempotency_django.purge import (
    database_now,
    default_database,
    purge_principal,
    send_evicted,
)

State = IdempotencyRecord.State

if TYPE_CHECKING:
    _AdminMixin = admin.ModelAdmin[Any]
else:  # a mixin: the admins list it before ModelAdmin in their bases
    _AdminMixin = object


def _log_deletions(request: HttpRequest, objects: Sequence[models.Model], message: str) -> None:
    """One admin log entry per deleted object."""
    user_id = request.user.pk
    assert user_id is not None  # the admin's views need a logged-in user
    LogEntry.objects.log_actions(
        user_id=user_id, queryset=objects, action_flag=DELETION, change_message=message
    )


def live_reservation_count(records: models.Model | QuerySet[Any]) -> int:
    """How many of ``records`` (a record, or a queryset of them) are reservations within
    their takeover window by the database's clock: their requests may still be running.

    Django's delete pages (evicting keys) show it, as the release confirmation does.
    """
    using = default_database()
    if isinstance(records, models.Model):
        records = type(records)._base_manager.using(using).filter(pk=records.pk)
    # The selection's own query (a COUNT), never a list of its keys: "select all"
    # on a big table is a selection of millions.
    return records.filter(state=State.IN_PROGRESS, expires_at__gt=database_now(using)).count()


class ReleaseMixin(_AdminMixin):
    """The "release selected stuck reservations" action, and the confirmation pages' context."""

    @admin.action(description=_("Release selected stuck reservations"), permissions=["delete"])
    def release_reservations(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> HttpResponse | None:
        """Delete the selected reservations (after confirmation), so a retry of the key runs.

        Only rows still in progress go: a record that completed meanwhile is kept.
        """
        reservations = queryset.filter(state=State.IN_PROGRESS)
        if request.POST.get("post") == "yes":
            # Where the store writes, never the read alias a router may send
            # the changelist's queryset to (a replica keeps its rows otherwise).
            using = default_database()
            with transaction.atomic(using=using):
                released = list(reservations.using(using).select_for_update())
                if released:
                    _log_deletions(request, released, "Released stuck reservation.")
                    self.model._base_manager.using(using).filter(
                        Q(pk__in=[obj.pk for obj in released]) & Q(state=State.IN_PROGRESS)
                    ).delete()
                    send_evicted(released, reason="release", user=request.user)
            if released:
                self.message_user(
                    request,
                    ngettext(
                        "Released %(count)d reservation.",
                        "Released %(count)d reservations.",
                        len(released),
                    )
                    % {"count": len(released)},
                    messages.SUCCESS,
                )
            else:
                self.message_user(
                    request, _("None of the selected records is a reservation."), messages.WARNING
                )
            return None

        selected = list(reservations.order_by("expires_at"))
        if not selected:
            self.message_user(
                request,
                _("None of the selected records is a reservation in progress; nothing released."),
                messages.WARNING,
            )
            return None
        # The database's clock, which the store's claims and takeovers use: an app
        # server whose clock runs ahead must not call a running request's
        # reservation abandoned, and so not warn before it is released.
        now = database_now(default_database())
        context = {
            **self._action_context(request, _("Release stuck reservations?")),
            "reservations": [(obj, obj.expires_at <= now) for obj in selected],
            "live_count": sum(1 for obj in selected if obj.expires_at > now),
            "skipped_count": queryset.count() - len(selected),
            "action_name": "release_reservations",
        }
        return TemplateResponse(
            request, self._confirmation_templates("release_confirmation"), context
        )

    def _action_context(self, request: HttpRequest, title: Any) -> dict[str, Any]:
        opts = self.model._meta
        request.current_app = self.admin_site.name
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "subtitle": None,
            "opts": opts,
            "app_label": opts.app_label,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }

    def _confirmation_templates(self, name: str) -> list[str]:
        """The model's, then the app's template: Django's lookup for delete pages."""
        opts = self.model._meta
        return [
            f"admin/{opts.app_label}/{opts.model_name}/{name}.html",
            f"admin/{opts.app_label}/{name}.html",
        ]


class RecordActionsMixin(ReleaseMixin):
    """A request record's page releases its reservation; principals' records deleted at once."""

    #: The most principals one "delete all records of" may cover: it is meant
    #: for one person's data, not for emptying the table.
    max_principals_per_deletion = 100

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        release = path(
            "<path:object_id>/release/",
            self.admin_site.admin_view(self.release_view),
            name=f"{opts.app_label}_{opts.model_name}_release",
        )
        # First: the admin's own "<path:object_id>/" would take ".../release/" too.
        return [release, *super().get_urls()]

    def release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The record page's "Release this reservation": the release action's confirmation
        for this one record (GET), then the release (its form's POST)."""
        obj = self.get_object(request, unquote(object_id))
        opts = self.model._meta
        changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        if obj is None:
            self.message_user(request, _("The record is gone."), messages.WARNING)
            return HttpResponseRedirect(changelist)
        if not self.has_delete_permission(request, obj):
            raise PermissionDenied
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        selected = self.get_queryset(request).filter(pk=obj.pk)
        response = self.release_reservations(request, selected)
        if response is not None:
            return response
        if not self.model._base_manager.using(default_database()).filter(pk=obj.pk).exists():
            return HttpResponseRedirect(changelist)  # released: its page is gone
        return HttpResponseRedirect(
            reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
        )

    # -- deleting every record of principals --

    @admin.action(
        description=_("Delete all records of the selected records' principals"),
        permissions=["delete"],
    )
    def delete_principal_records(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> HttpResponse | None:
        """Delete every record of each selected record's principal, after confirmation.

        For an account deletion or an erasure request: all of the principal's
        records go, live or not, selected or not, in every location.
        """
        principals = sorted(set(queryset.order_by().values_list("principal", flat=True)))
        # Where the store writes: an erasure on a replica would erase nothing.
        using = default_database()
        if len(principals) > self.max_principals_per_deletion:
            self.message_user(
                request,
                _(
                    "The selected records belong to %(count)d principals; select the records "
                    "of at most %(most)d at a time."
                )
                % {"count": len(principals), "most": self.max_principals_per_deletion},
                messages.ERROR,
            )
            return None
        if request.POST.get("post") == "yes":
            deleted = 0
            for principal in principals:
                message = f"Deleted with every record of principal {principal}."
                log = partial(_log_deletions, request, message=message)
                deleted += purge_principal(principal, using=using, on_batch=log)
            self.message_user(
                request,
                ngettext(
                    "Deleted every record of %(principals)d principal (%(count)d in all).",
                    "Deleted every record of %(principals)d principals (%(count)d in all).",
                    len(principals),
                )
                % {"count": deleted, "principals": len(principals)},
                messages.SUCCESS,
            )
            return None

        # What the deletion will count: each principal's records, exactly.
        counts = {p: purge_principal(p, using=using, dry_run=True) for p in principals}
        names = principal_usernames(principals)
        rows = [
            (render_principal(principal, names.get(principal)), counts.get(principal, 0))
            for principal in principals
        ]
        context = {
            **self._action_context(request, _("Delete all records of these principals?")),
            "principals": rows,
            "total": sum(counts.values()),
            "selected_pks": list(queryset.order_by().values_list("pk", flat=True)),
            "action_name": "delete_principal_records",
        }
        templates = self._confirmation_templates("principal_delete_confirmation")
        return TemplateResponse(request, templates, context)
