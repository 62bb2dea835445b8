"""The Django admin for idempotency records: inspect, evict a key, release a stuck reservation.

Records are read-only here: the store writes them, never a person.
:class:`ExpiringRecordAdmin` is what the requests' and the webhook deliveries' admins
share; the actions are in ``actions.py``, the changelist's filters and paginator in
``filters.py``, the rendering in ``display.py``.

The changelist stays fast on a table of millions of rows: no full COUNT(*) beyond the
filtered one (none on PostgreSQL when unfiltered), no facet counts, no DISTINCT scans
for the filter choices, the stored bodies and headers not loaded, the users the page's
principals name read in one query. Stored responses are other people's data: only
staff holding ``idempotency_django.view_stored_response`` see bodies and header values.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from idempotency_django.admin.actions import RecordActionsMixin
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
from idempotency_django.purge import send_evicted
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

#: Columns no URL parameter may filter on: the owner token is a secret, and a
#: lookup such as ``?response_body__gt=...`` would let staff without
#: :data:`STORED_RESPONSE_PERMISSION` read a body one comparison at a time.
UNFILTERABLE_FIELDS = frozenset({"token", "response_body", "response_headers"})


if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:  # ModelAdmin is not subscriptable at runtime without django-stubs-ext.
    _ModelAdmin = admin.ModelAdmin


class ExpiringRecordAdmin(RecordActionsMixin, _ModelAdmin):
    """Read-only admin for rows of the idempotency table (requests or webhook deliveries).

    Viewing needs the view permission; deleting ("evict a key") and releasing
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

    # -- permissions --

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Read-only: Django renders the view-only page for users who may view,
        # every field of the fieldsets (the display callables too) read-only.
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

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Any:
        paginator = super().get_paginator(
            request, queryset, per_page, orphans, allow_empty_first_page
        )
        if isinstance(paginator, EstimatedCountPaginator):
            # The page without filters or search is this admin's own queryset.
            paginator.unfiltered = self.get_queryset(request)
        return paginator

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # With another store the keys live there: rows kept by the database store before
        # would otherwise read as the live ones, a release or an eviction as effective.
        store = idempotency_settings.STORE
        if store != "database":
            name = STORE_NAMES.get(store, store)
            notice = gettext(
                'The active store is %(name)s (IDEMPOTENCY["STORE"] = "%(store)s"): these '
                "database records are not the live ones. Keys are claimed, replayed and "
                "released in that store; releasing or deleting a row here changes nothing "
                "there."
            ) % {"name": name, "store": store}
            extra_context = {**(extra_context or {}), "idempotency_store_notice": notice}
        return super().changelist_view(request, extra_context)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if lookup.split("__", 1)[0] in UNFILTERABLE_FIELDS:
            return False
        return super().lookup_allowed(lookup, value, request)

    # -- columns and detail fields --

    @admin.display(description=_("state"), ordering="state")
    def state_display(self, obj: IdempotencyRecord) -> str:
        value = expiry_state(obj.state, obj.expires_at)
        if value == EXPIRED:
            return str(_("expired"))
        return str(State(value).label)

    @admin.display(description=_("created"), ordering="created_at")
    def created_display(self, obj: IdempotencyRecord) -> SafeString | str:
        return render_relative_time(obj.created_at)

    @admin.display(description=_("expires"), ordering="expires_at")
    def expires_display(self, obj: IdempotencyRecord) -> SafeString | str:
        return render_relative_time(obj.expires_at)

    @admin.display(description=_("request fingerprint"))
    def fingerprint_display(self, obj: IdempotencyRecord) -> SafeString:
        return format_html("<code>{}</code>", obj.fingerprint)


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ExpiringRecordAdmin):
    """Requests' and tasks' records: who sent them (the user a principal names), and their
    responses."""

    actions = ["release_reservations", "delete_principal_records"]

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

    # -- the record's page: a readable title --

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
        return super().render_change_form(request, context, add, change, form_url, obj)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # Webhook deliveries share the table; they have their own page. Background
        # tasks' records (principal "task:<name>", method TASK) are listed here: a
        # worker that died mid-task leaves a reservation to see and release.
        return super().get_queryset(request).exclude(kind=IdempotencyRecord.Kind.WEBHOOK)

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
        if opened is None:
            return ""
        try:
            stored = json.loads(opened[1] or b"{}")
        except ValueError:
            return ""
        run_id = stored.get("run_id") if isinstance(stored, dict) else None
        return "" if run_id is None else str(run_id)
