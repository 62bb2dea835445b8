"""The Django admin for idempotency records: inspect, evict a key, release a stuck reservation.

Records are read-only here: they are written by the store, never by hand.
The list filters and the paginator are in :mod:`idempotency_django.admin_filters`,
the rendering of bodies, headers and principals in
:mod:`idempotency_django.admin_display`; :class:`ExpiringRecordAdmin` holds
what the two admins here (requests' records, webhook deliveries) share.

The changelist stays fast on a table of millions of rows: no full COUNT(*)
beyond the filtered one (none at all on PostgreSQL when unfiltered), no
facet counts, no DISTINCT scans for the filter choices, no foreign keys to
join, the stored bodies and headers are not loaded, and the users that the
page's principals name are read in one query.

Stored responses are other people's data: only staff holding
``idempotency_django.view_stored_response`` see bodies and header values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import models, transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import formats, timezone
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from idempotency_django.admin_display import (
    BODY_DISPLAY_LIMIT,
    TOKEN_MAX_LENGTH,
    principal_usernames,
    principals_of_users,
    render_body,
    render_body_summary,
    render_header_names,
    render_headers,
    render_principal,
    render_token,
    render_undecryptable,
)
from idempotency_django.admin_filters import (
    EXPIRED,
    EstimatedCountPaginator,
    ExpiryStateFilter,
    LocationFilter,
    MethodFilter,
    RecentValuesFilter,
    SourceFilter,
    StatusClassFilter,
    expiry_state,
)
from idempotency_django.encryption import open_columns
from idempotency_django.models import IdempotencyRecord, WebhookDelivery
from idempotency_django.purge import default_database, purge_principal, send_evicted
from idempotency_django.stores.base import StoreUnavailable
from idempotency_django.webhook_identity import TRIGGER_PREFIX

__all__ = [
    "BODY_DISPLAY_LIMIT",
    "STORED_RESPONSE_PERMISSION",
    "EstimatedCountPaginator",
    "ExpiringRecordAdmin",
    "ExpiryStateFilter",
    "IdempotencyRecordAdmin",
    "LocationFilter",
    "MethodFilter",
    "RecentValuesFilter",
    "SourceFilter",
    "StatusClassFilter",
    "WebhookDeliveryAdmin",
    "expiry_state",
    "render_body",
    "render_headers",
]

State = IdempotencyRecord.State

#: The permission (``Meta.permissions`` of the record) that shows stored bodies.
STORED_RESPONSE_PERMISSION = "idempotency_django.view_stored_response"

#: Columns no URL parameter may filter on: the owner token is a secret, and a
#: lookup such as ``?response_body__gt=...`` would let staff without
#: :data:`STORED_RESPONSE_PERMISSION` read a body one comparison at a time.
UNFILTERABLE_FIELDS = frozenset({"token", "response_body", "response_headers"})


def _log_deletions(request: HttpRequest, objects: Sequence[models.Model], message: str) -> None:
    """One admin log entry per deleted object."""
    user_id = request.user.pk
    assert user_id is not None  # the admin's views need a logged-in user
    LogEntry.objects.log_actions(
        user_id=user_id, queryset=objects, action_flag=DELETION, change_message=message
    )


def _relative_time(value: datetime | None) -> SafeString | str:
    """Say "5 minutes ago" or "in 23 hours", with the date and time on hover.

    Keys live minutes to days, so how long ago and how soon matter more in the
    list than the date, and take half its width.
    """
    if value is None:
        return ""
    now = timezone.now()
    if abs(value - now) < timedelta(minutes=1):
        text = gettext("now")
    elif value < now:
        text = gettext("%(delta)s ago") % {"delta": timesince(value, now, depth=1)}
    else:
        text = gettext("in %(delta)s") % {"delta": timeuntil(value, now, depth=1)}
    local = timezone.localtime(value)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        local.isoformat(),
        formats.date_format(local, "DATETIME_FORMAT"),
        text,
    )


# -- the admin ----------------------------------------------------------------

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:  # ModelAdmin is not subscriptable at runtime without django-stubs-ext.
    _ModelAdmin = admin.ModelAdmin


class ExpiringRecordAdmin(_ModelAdmin):
    """Read-only admin for rows of the idempotency table (requests or webhook deliveries).

    Viewing needs the view permission; deleting ("evict a key") and releasing
    stuck reservations need the delete permission. Nobody adds or edits rows.
    """

    #: Columns never loaded for the changelist.
    changelist_defer: ClassVar[tuple[str, ...]] = ("response_body", "response_headers")

    actions = ["release_reservations"]
    show_full_result_count = False
    if hasattr(admin, "ShowFacets"):  # Django 5.0+: facet counts are a COUNT per choice
        show_facets = admin.ShowFacets.NEVER
    list_per_page = 50
    list_max_show_all = 500
    paginator = EstimatedCountPaginator
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    exclude = ("token",)

    # -- permissions --

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Read-only: Django renders the view-only page for users who may view.
        return False

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        """Evict one key (the delete view): a retry of it then runs again."""
        super().delete_model(request, obj)
        send_evicted([obj], reason="evict", user=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Evict the selected keys (the delete action)."""
        evicted = list(queryset.only("pk", "digest"))
        super().delete_queryset(request, queryset)
        send_evicted(evicted, reason="evict", user=request.user)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        if lookup.split("__", 1)[0] in UNFILTERABLE_FIELDS:
            return False
        if request is None:  # pragma: no cover - Django < 5.0 passes no request
            return super().lookup_allowed(lookup, value)  # type: ignore[call-arg]
        return super().lookup_allowed(lookup, value, request)

    # -- queries --

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        opts = self.model._meta
        if match is not None and match.url_name == f"{opts.app_label}_{opts.model_name}_changelist":
            queryset = queryset.defer(*self.changelist_defer)
        return queryset

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Everything shown is read-only, and the display callables must be
        # listed here to be allowed in the fieldsets.
        return [str(field) for field in flatten_fieldsets(self.get_fieldsets(request, obj))]

    # -- columns and detail fields --

    @admin.display(description=_("state"), ordering="state")
    def state_display(self, obj: IdempotencyRecord) -> str:
        value = expiry_state(obj.state, obj.expires_at)
        if value == EXPIRED:
            return str(_("expired"))
        return str(State(value).label)

    @admin.display(description=_("created"), ordering="created_at")
    def created_display(self, obj: IdempotencyRecord) -> SafeString | str:
        return _relative_time(obj.created_at)

    @admin.display(description=_("expires"), ordering="expires_at")
    def expires_display(self, obj: IdempotencyRecord) -> SafeString | str:
        return _relative_time(obj.expires_at)

    @admin.display(description=_("request fingerprint"))
    def fingerprint_display(self, obj: IdempotencyRecord) -> SafeString:
        return format_html("<code>{}</code>", obj.fingerprint)

    # -- actions --

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
        now = timezone.now()
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


class RecordChangeList(ChangeList):
    """The records changelist, naming the users behind the page's principals in one query."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        names = principal_usernames({obj.principal for obj in self.result_list})
        for obj in self.result_list:
            obj.principal_username = names.get(obj.principal)


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ExpiringRecordAdmin):
    """Requests' records: who sent them (the user a principal names), and their responses."""

    actions = ["release_reservations", "delete_principal_records"]
    #: The most principals one "delete all records of" may cover: it is meant
    #: for one person's data, not for emptying the table.
    max_principals_per_deletion = 100

    list_display = (
        "key_display",
        "scope_display",
        "request_display",
        "outcome_display",
        "created_display",
        "expires_display",
    )
    list_filter = (
        ExpiryStateFilter,
        StatusClassFilter,
        MethodFilter,
        LocationFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    #: Also: a whole username or email address finds that user's records
    #: (see :meth:`get_search_results`).
    search_fields = ("key", "path", "principal")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if request.user.has_perm(STORED_RESPONSE_PERMISSION):
            response = ("status_code", "headers_display", "body_display")
        else:
            response = ("status_code", "header_names_display", "body_summary_display")
        return (
            (_("Key"), {"fields": ("key", "principal_display", "location", "kind")}),
            (_("Request"), {"fields": ("method", "path", "request_id", "fingerprint_display")}),
            (_("State"), {"fields": ("state_display", "created_at", "completed_at", "expires_at")}),
            (_("Stored response"), {"fields": response}),
        )

    # -- the record's page: a readable title, and releasing a reservation from it --

    def record_title(self, obj: IdempotencyRecord) -> str:
        """``order-1001-move by alice at hotel-lisbon``: the key and whose it is, in words."""
        who = self._username(obj) or obj.principal
        if len(who) > TOKEN_MAX_LENGTH:
            who = who[: TOKEN_MAX_LENGTH - 1] + "…"
        if obj.location:
            return gettext("%(key)s by %(who)s at %(location)s") % {
                "key": obj.key,
                "who": who,
                "location": obj.location,
            }
        return gettext("%(key)s by %(who)s") % {"key": obj.key, "who": who}

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        if obj is not None:
            context["subtitle"] = self.record_title(obj)
            context["can_release"] = obj.state == State.IN_PROGRESS and self.has_delete_permission(
                request, obj
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

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

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # Webhook deliveries share the table; they have their own page.
        records: QuerySet[Any] = (
            super().get_queryset(request).filter(kind=IdempotencyRecord.Kind.REQUEST)
        )
        return records

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RecordChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        principals = principals_of_users(search_term)
        if principals:
            results = results | queryset.filter(principal__in=principals)
        return results, may_have_duplicates

    # -- columns and detail fields --

    @admin.display(description=_("principal"), ordering="principal")
    def principal_display(self, obj: IdempotencyRecord) -> SafeString:
        return render_principal(obj.principal, self._username(obj))

    @admin.display(description=_("principal"), ordering="principal")
    def scope_display(self, obj: IdempotencyRecord) -> SafeString:
        """The principal, and under it the location when there is one: a column less."""
        principal = render_principal(obj.principal, self._username(obj))
        if not obj.location:
            return principal
        # The translated text escaped, the location a token that never breaks inside.
        located = conditional_escape(gettext("location: %(location)s")) % {
            "location": render_token(obj.location)
        }
        return format_html('{}<br><span class="quiet">{}</span>', principal, mark_safe(located))

    def _username(self, obj: IdempotencyRecord) -> str | None:
        # The changelist sets principal_username for its whole page at once.
        if hasattr(obj, "principal_username"):
            username: str | None = obj.principal_username
            return username
        return principal_usernames([obj.principal]).get(obj.principal)

    @admin.display(description=_("key"), ordering="key")
    def key_display(self, obj: IdempotencyRecord) -> str:
        return obj.key

    @admin.display(description=_("request"), ordering="path")
    def request_display(self, obj: IdempotencyRecord) -> SafeString:
        return format_html("{} {}", render_token(obj.method), render_token(obj.path, "/"))

    @admin.display(description=_("state"), ordering="state")
    def outcome_display(self, obj: IdempotencyRecord) -> SafeString:
        """The state and, once there is one, the stored response's status: one narrow column."""
        if obj.status_code is None:
            return format_html("{}", self.state_display(obj))
        return format_html(
            '{} <span class="quiet">{}</span>', self.state_display(obj), obj.status_code
        )

    # Which of these four a page shows is decided by the stored-response
    # permission (get_fieldsets); each decrypts only to render what it shows.

    @admin.display(description=_("response headers"))
    def headers_display(self, obj: IdempotencyRecord) -> SafeString:
        opened = _opened(obj)
        return render_undecryptable() if opened is None else render_headers(opened[0])

    @admin.display(description=_("response body"))
    def body_display(self, obj: IdempotencyRecord) -> SafeString:
        opened = _opened(obj)
        return render_undecryptable() if opened is None else render_body(opened[1])

    @admin.display(description=_("response headers"))
    def header_names_display(self, obj: IdempotencyRecord) -> SafeString:
        opened = _opened(obj)
        return render_undecryptable() if opened is None else render_header_names(opened[0])

    @admin.display(description=_("response body"))
    def body_summary_display(self, obj: IdempotencyRecord) -> SafeString:
        opened = _opened(obj)
        if opened is None:
            return render_undecryptable()
        return render_body_summary(opened[1], opened[0])

    # -- actions --

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

                def log(batch: Sequence[IdempotencyRecord], message: str = message) -> None:
                    _log_deletions(request, batch, message)

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


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ExpiringRecordAdmin):
    """Accepted (and running) webhook deliveries: read-only, like the records."""

    #: Hex digits of the trigger digest shown in the list (all of it on hover).
    trigger_digest_shown = 12
    # The run id column reads the stored body, which for a delivery is only
    # {"run_id": ...} (see webhooks), and the headers, which say whether it is
    # encrypted (a delivery stores none of its own): both are loaded with the row.
    changelist_defer = ()

    list_display = (
        "delivery_id",
        "source",
        "trigger_display",
        "state_display",
        "run_id_display",
        "received_display",
        "expires_display",
    )
    list_filter = (ExpiryStateFilter, SourceFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("key",)
    fieldsets = (
        (_("Delivery"), {"fields": ("delivery_id", "source", "trigger_full", "run_id_display")}),
        (_("State"), {"fields": ("state_display", "created_at", "completed_at", "expires_at")}),
    )

    @admin.display(description=_("delivery id"), ordering="key")
    def delivery_id(self, obj: WebhookDelivery) -> str:
        return obj.key

    @admin.display(description=_("trigger"), ordering="principal")
    def trigger_display(self, obj: WebhookDelivery) -> SafeString:
        digest = obj.principal.removeprefix(TRIGGER_PREFIX)
        shown = digest[: self.trigger_digest_shown]
        return format_html(
            '<code title="{}">{}{}</code>', digest, shown, "…" if shown != digest else ""
        )

    @admin.display(description=_("trigger digest"))
    def trigger_full(self, obj: WebhookDelivery) -> SafeString:
        return format_html("<code>{}</code>", obj.principal.removeprefix(TRIGGER_PREFIX))

    @admin.display(description=_("received"), ordering="created_at")
    def received_display(self, obj: WebhookDelivery) -> SafeString | str:
        return _relative_time(obj.created_at)

    @admin.display(description=_("run id"))
    def run_id_display(self, obj: WebhookDelivery) -> str:
        opened = _opened(obj)
        if opened is None:
            return ""
        try:
            stored = json.loads(opened[1] or b"{}")
        except ValueError:
            return ""
        run_id = stored.get("run_id") if isinstance(stored, dict) else None
        return "" if run_id is None else str(run_id)


def _opened(obj: IdempotencyRecord) -> tuple[Any, bytes] | None:
    """The record's stored headers and body, decrypted; None when they cannot be.

    Kept on the object: a detail page renders the headers and the body apart.
    """
    if not hasattr(obj, "_idempotency_opened"):
        try:
            opened: tuple[Any, bytes] | None = open_columns(obj.response_headers, obj.response_body)
        except StoreUnavailable:  # no key opens it, or the keys are unusable (E015, E016)
            opened = None
        obj._idempotency_opened = opened  # type: ignore[attr-defined]
    result: tuple[Any, bytes] | None = obj._idempotency_opened  # type: ignore[attr-defined]
    return result
