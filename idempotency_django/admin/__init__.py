"""The Django admin of the records: read them, evict keys, release stuck reservations and
delete one principal's records, each confirmed on Django's own delete page.

Records are read-only here: the store writes them, never a person. The lists stay fast
on millions of rows: no full COUNT(*) beyond the filtered one (none on PostgreSQL when
unfiltered), no facet counts, no DISTINCT scans for the filter choices (``filters.py``),
the stored bodies and headers not loaded, the page's users named in one query. Stored
responses are other people's data: only staff holding
``idempotency_django.view_stored_response`` see bodies and header values (``display.py``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.admin.views.main import ChangeList
from django.db import models, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from idempotency_django.admin.display import (
    BODY_DISPLAY_LIMIT,
    TOKEN_MAX_LENGTH,
    open_stored_response,
    principal_usernames,
    principals_of_users,
    render_body,
    render_body_summary,
    render_headers,
    render_opened,
    render_principal,
    render_relative_time,
    render_token,
)
from idempotency_django.admin.filters import (
    EXPIRED,
    EstimatedCountPaginator,
    ExpiryStateFilter,
    LocationFilter,
    MethodFilter,
    RecentValuesFilter,
    RecordChangeList,
    SourceFilter,
    StatusClassFilter,
    expiry_state,
)
from idempotency_django.conf import idempotency_settings
from idempotency_django.models import IdempotencyRecord, WebhookDelivery
from idempotency_django.purge import default_database, purge_principal, send_evicted
from idempotency_django.webhooks.identity import TRIGGER_PREFIX

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
#: How the changelist names a store other than the database one.
STORE_NAMES = {"redis": "Redis", "memory": "the in-process memory store"}
#: Columns no URL parameter may filter on: the owner token is a secret, and a lookup
#: such as ``?response_body__gt=...`` would let staff without
#: :data:`STORED_RESPONSE_PERMISSION` read a body one comparison at a time.
UNFILTERABLE_FIELDS = frozenset({"token", "response_body", "response_headers"})

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:  # ModelAdmin is not subscriptable at runtime without django-stubs-ext.
    _ModelAdmin = admin.ModelAdmin


def log_deletions(request: HttpRequest, objects: Sequence[models.Model], message: str) -> None:
    """One admin log entry per object, saying why it went (Django's says nothing)."""
    assert request.user.pk is not None  # the admin's views need a logged-in user
    LogEntry.objects.log_actions(
        user_id=request.user.pk, queryset=objects, action_flag=DELETION, change_message=message
    )


def confirmation(
    model_admin: Any, request: HttpRequest, queryset: QuerySet[Any], action: str, **context: Any
) -> TemplateResponse:
    """Django's "Delete selected" confirmation of ``queryset`` for ``action`` (its form posts
    back to it: see delete_selected_confirmation.html), ``context`` on top."""
    response = delete_selected(model_admin, request, queryset)
    assert isinstance(response, TemplateResponse)  # without "post", always the page
    assert response.context_data is not None
    response.context_data.update(action_name=action, **context)
    return response


class ExpiringRecordAdmin(_ModelAdmin):
    """Read-only admin of the records' table (requests, or webhook deliveries).

    Viewing needs the view permission; evicting keys (Django's delete) and releasing
    stuck reservations need the delete permission. Nobody adds or edits rows.
    """

    actions = ["release_reservations"]
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a facet count is a COUNT per choice
    list_per_page = 50
    list_max_show_all = 500
    paginator = EstimatedCountPaginator
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    exclude = ("token",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Django then renders the view-only page: every field, display callables too, read-only.
        return False

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        super().delete_model(request, obj)
        send_evicted([obj], reason="evict", user=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        evicted = list(queryset.only("pk", "digest"))
        super().delete_queryset(request, queryset)
        send_evicted(evicted, reason="evict", user=request.user)

    def get_paginator(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        paginator = super().get_paginator(request, *args, **kwargs)
        if isinstance(paginator, EstimatedCountPaginator):
            # A page without filters or search is this admin's own queryset.
            paginator.unfiltered = self.get_queryset(request)
        return paginator

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # With another store the keys live there: rows kept by the database store before
        # would otherwise read as the live ones, a release or an eviction as effective.
        store = idempotency_settings.STORE
        if store != "database":
            notice = {"idempotency_store": store, "store_name": STORE_NAMES.get(store, store)}
            extra_context = {**(extra_context or {}), **notice}
        return super().changelist_view(request, extra_context)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if lookup.split("__", 1)[0] in UNFILTERABLE_FIELDS:
            return False
        return super().lookup_allowed(lookup, value, request)

    @admin.action(description=_("Release selected stuck reservations"), permissions=["delete"])
    def release_reservations(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> TemplateResponse | None:
        """Delete the selected reservations after confirmation, so a retry of the key runs.
        A record that completed meanwhile is kept."""
        reservations = queryset.filter(state=State.IN_PROGRESS)
        if not request.POST.get("post"):
            if reservations.exists():
                return confirmation(
                    self,
                    request,
                    reservations,
                    "release_reservations",
                    title=_("Release stuck reservations?"),
                    skipped_count=queryset.count() - reservations.count(),
                )
            message = _(
                "None of the selected records is a reservation in progress; nothing released."
            )
            self.message_user(request, message, messages.WARNING)
            return None
        # Where the store writes, never the read alias a router may send the
        # changelist's queryset to (a replica keeps its rows otherwise).
        using = default_database()
        with transaction.atomic(using=using):
            released = list(reservations.using(using).select_for_update())
            log_deletions(request, released, "Released stuck reservation.")
            self.model._base_manager.using(using).filter(
                pk__in=[obj.pk for obj in released], state=State.IN_PROGRESS
            ).delete()
            send_evicted(released, reason="release", user=request.user)
        if released:
            done = ngettext(
                "Released %(count)d reservation.", "Released %(count)d reservations.", len(released)
            )
            self.message_user(request, done % {"count": len(released)}, messages.SUCCESS)
        else:
            gone = _("None of the selected records is a reservation.")
            self.message_user(request, gone, messages.WARNING)
        return None

    @admin.display(description=_("state"), ordering="state")
    def state_display(self, obj: IdempotencyRecord) -> str:
        value = expiry_state(obj.state, obj.expires_at)
        return str(_("expired") if value == EXPIRED else State(value).label)

    @admin.display(description=_("created"), ordering="created_at")
    def created_display(self, obj: IdempotencyRecord) -> SafeString | str:
        return render_relative_time(obj.created_at)

    @admin.display(description=_("expires"), ordering="expires_at")
    def expires_display(self, obj: IdempotencyRecord) -> SafeString | str:
        return render_relative_time(obj.expires_at)


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ExpiringRecordAdmin):
    """Requests' and tasks' records: who sent them (the user a principal names), and their
    responses."""

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
    #: Also: a whole username or email address finds that user's records.
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
            # The page's title: "order-1001-move by alice at hotel-lisbon", not the row's str().
            who = self._username(obj) or obj.principal
            if len(who) > TOKEN_MAX_LENGTH:
                who = who[: TOKEN_MAX_LENGTH - 1] + "…"
            names = {"key": obj.key, "who": who, "location": obj.location}
            if obj.location:
                title = gettext("%(key)s by %(who)s at %(location)s")
            else:
                title = gettext("%(key)s by %(who)s")
            context["subtitle"] = title % names
        return super().render_change_form(request, context, add, change, form_url, obj)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # Webhook deliveries share the table and have their own page. Background tasks'
        # records (principal "task:<name>", method TASK) are listed here: a worker that
        # died mid-task leaves a reservation to see and release.
        return super().get_queryset(request).exclude(kind=IdempotencyRecord.Kind.WEBHOOK)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RecordChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        principals = principals_of_users(search_term)
        if principals:
            results |= queryset.filter(principal__in=principals)
        return results, may_have_duplicates

    @admin.action(
        description=_("Delete all records of the selected records' principals"),
        permissions=["delete"],
    )
    def delete_principal_records(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> TemplateResponse | None:
        """Delete every record of each selected record's principal, after confirmation: for
        an account deletion or an erasure request. All of them go, live or not, selected or
        not, in every location."""
        principals = sorted(set(queryset.order_by().values_list("principal", flat=True)))
        most = self.max_principals_per_deletion
        if len(principals) > most:
            too_many = _(
                "The selected records belong to %(count)d principals; select the records "
                "of at most %(most)d at a time."
            )
            self.message_user(
                request, too_many % {"count": len(principals), "most": most}, messages.ERROR
            )
            return None
        # Where the store writes: an erasure on a replica would erase nothing.
        using = default_database()
        if not request.POST.get("post"):
            # Each principal and how many of its records go, exactly, in place of the
            # selected records; the page's form posts the selection back.
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
        ) % {"count": deleted, "principals": len(principals)}
        self.message_user(request, done, messages.SUCCESS)
        return None

    def _username(self, obj: IdempotencyRecord) -> str | None:
        # The changelist sets principal_username for its whole page at once.
        if hasattr(obj, "principal_username"):
            return obj.principal_username  # type: ignore[no-any-return]
        return principal_usernames([obj.principal]).get(obj.principal)

    @admin.display(description=_("key"), ordering="key")
    def key_display(self, obj: IdempotencyRecord) -> str:
        return obj.key

    @admin.display(description=_("principal"), ordering="principal")
    def principal_display(self, obj: IdempotencyRecord) -> SafeString:
        return render_principal(obj.principal, self._username(obj))

    @admin.display(description=_("principal"), ordering="principal")
    def scope_display(self, obj: IdempotencyRecord) -> SafeString:
        """The principal, and under it the location when there is one: a column less."""
        if not obj.location:
            return self.principal_display(obj)
        # The translated text escaped, the location a token that never breaks inside.
        located = conditional_escape(gettext("location: %(location)s")) % {
            "location": render_token(obj.location)
        }
        return format_html(
            '{}<br><span class="quiet">{}</span>', self.principal_display(obj), mark_safe(located)
        )

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

    @admin.display(description=_("request fingerprint"))
    def fingerprint_display(self, obj: IdempotencyRecord) -> SafeString:
        return format_html("<code>{}</code>", obj.fingerprint)

    # Which two of these four a page shows is the stored-response permission's
    # decision (get_fieldsets); each decrypts only to render what it shows.

    @admin.display(description=_("response headers"))
    def headers_display(self, obj: IdempotencyRecord) -> SafeString:
        return render_opened(obj, lambda headers, body: render_headers(headers))

    @admin.display(description=_("response body"))
    def body_display(self, obj: IdempotencyRecord) -> SafeString:
        return render_opened(obj, lambda headers, body: render_body(body))

    @admin.display(description=_("response headers"))
    def header_names_display(self, obj: IdempotencyRecord) -> SafeString:
        return render_opened(obj, lambda headers, body: render_headers(headers, values=False))

    @admin.display(description=_("response body"))
    def body_summary_display(self, obj: IdempotencyRecord) -> SafeString:
        return render_opened(obj, lambda headers, body: render_body_summary(body, headers))


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ExpiringRecordAdmin):
    """Accepted (and running) webhook deliveries: read-only, like the records."""

    #: Hex digits of the trigger digest shown in the list (all of it on hover).
    trigger_digest_shown = 12

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
        return render_relative_time(obj.created_at)

    @admin.display(description=_("run id"))
    def run_id_display(self, obj: WebhookDelivery) -> str:
        opened = open_stored_response(obj)
        try:
            stored = json.loads(opened[1] or b"{}") if opened else None
        except ValueError:
            return ""
        run_id = stored.get("run_id") if isinstance(stored, dict) else None
        return "" if run_id is None else str(run_id)
