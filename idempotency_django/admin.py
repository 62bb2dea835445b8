"""The Django admin for idempotency records: inspect, evict a key, release a stuck reservation.

Records are read-only here: they are written by the store, never by hand.
Everything shared by the record admin and admins of other expiring records
(e.g. webhook deliveries, which live in the same table) is a reusable piece:
:class:`ExpiryStateFilter`, :class:`StatusClassFilter`, :class:`MethodFilter`,
:class:`RecentValuesFilter`, :class:`EstimatedCountPaginator`,
:func:`render_body`, :func:`render_headers` and :class:`ExpiringRecordAdmin`.

The changelist stays fast on a table of millions of rows: no full COUNT(*)
beyond the filtered one (none at all on PostgreSQL when unfiltered), no
facet counts, no DISTINCT scans for the filter choices, no foreign keys to
join, and the stored bodies and headers are not loaded.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.paginator import Paginator
from django.db import connections, models, transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from idempotency_django.conf import DEFAULTS, idempotency_settings
from idempotency_django.models import IdempotencyRecord, WebhookDelivery
from idempotency_django.webhooks import TRIGGER_PREFIX

__all__ = [
    "EstimatedCountPaginator",
    "ExpiringRecordAdmin",
    "ExpiryStateFilter",
    "IdempotencyRecordAdmin",
    "LocationFilter",
    "MethodFilter",
    "RecentValuesFilter",
    "StatusClassFilter",
    "expiry_state",
    "render_body",
    "render_headers",
]

State = IdempotencyRecord.State

#: Bodies longer than this are shown cut, with a note.
BODY_DISPLAY_LIMIT = 64 * 1024
#: How much of a binary body is shown as hex.
BINARY_PREVIEW = 32

IN_PROGRESS = str(State.IN_PROGRESS)
COMPLETED = str(State.COMPLETED)
EXPIRED = "expired"


def expiry_state(state: str, expires_at: datetime, now: datetime | None = None) -> str:
    """``"in_progress"``, ``"completed"``, or ``"expired"`` once past ``expires_at``."""
    if expires_at <= (now or timezone.now()):
        return EXPIRED
    return state


# -- list filters -------------------------------------------------------------


class ExpiryStateFilter(admin.SimpleListFilter):
    """In progress / completed / expired, from ``state`` and ``expires_at``.

    A row past ``expires_at`` counts as absent to the store, whatever its
    state, so it is "expired" here and neither of the others.
    """

    title = _("state")
    parameter_name = "state"
    state_field = "state"
    expires_field = "expires_at"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, Any]]:
        return [
            (IN_PROGRESS, _("in progress")),
            (COMPLETED, _("completed")),
            (EXPIRED, _("expired")),
        ]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[models.Model]
    ) -> QuerySet[models.Model] | None:
        value = self.value()
        now = timezone.now()
        if value == EXPIRED:
            lookup: dict[str, Any] = {f"{self.expires_field}__lte": now}
        elif value in (IN_PROGRESS, COMPLETED):
            lookup = {self.state_field: value, f"{self.expires_field}__gt": now}
        else:
            return queryset
        filtered: QuerySet[models.Model] = queryset.filter(**lookup)
        return filtered


class StatusClassFilter(admin.SimpleListFilter):
    """The stored response's status class: 2xx, 3xx, 4xx, 5xx, or none yet."""

    title = _("status class")
    parameter_name = "status_class"
    status_field = "status_code"
    NONE = "none"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, Any]]:
        return [
            ("2xx", _("2xx success")),
            ("3xx", _("3xx redirection")),
            ("4xx", _("4xx client error")),
            ("5xx", _("5xx server error")),
            (self.NONE, _("no response yet")),
        ]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[models.Model]
    ) -> QuerySet[models.Model] | None:
        value = self.value()
        if value == self.NONE:
            lookup: dict[str, Any] = {f"{self.status_field}__isnull": True}
        elif value in {"2xx", "3xx", "4xx", "5xx"}:
            low = int(value[0]) * 100
            lookup = {f"{self.status_field}__gte": low, f"{self.status_field}__lt": low + 100}
        else:
            return queryset
        filtered: QuerySet[models.Model] = queryset.filter(**lookup)
        return filtered


class MethodFilter(admin.SimpleListFilter):
    """The HTTP method, from the protected methods setting: no DISTINCT scan of the table."""

    title = _("method")
    parameter_name = "method"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, Any]]:
        order = [str(method) for method in DEFAULTS["METHODS"]]
        methods = sorted(
            idempotency_settings.METHODS,
            key=lambda m: (order.index(m) if m in order else len(order), m),
        )
        return [(method, method) for method in methods]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[models.Model]
    ) -> QuerySet[models.Model] | None:
        value = self.value()
        if value:
            filtered: QuerySet[models.Model] = queryset.filter(method=value.upper())
            return filtered
        return queryset


class RecentValuesFilter(admin.SimpleListFilter):
    """The distinct values of ``field`` among the newest ``sample_size`` rows.

    Django's default filter for a plain field runs ``SELECT DISTINCT`` over the
    whole table, a full scan on millions of rows; this reads the newest rows by
    primary key instead. Filtering by any value (e.g. from a bookmarked URL)
    still works, whether or not it is listed.
    """

    field = ""
    sample_size = 10_000
    max_choices = 50

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, Any]]:
        recent = model_admin.get_queryset(request).order_by("-pk")[: self.sample_size]
        values = sorted({str(v) for v in recent.values_list(self.field, flat=True) if v})
        current = self.value()
        if current and current not in values:
            values.append(current)
        return [(value, value) for value in values[: self.max_choices]]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[models.Model]
    ) -> QuerySet[models.Model] | None:
        value = self.value()
        if value is None:
            return queryset
        filtered: QuerySet[models.Model] = queryset.filter(**{self.field: value})
        return filtered


class LocationFilter(RecentValuesFilter):
    title = _("location")
    parameter_name = "location"
    field = "location"


# -- pagination ---------------------------------------------------------------


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Skip ``COUNT(*)`` of a whole big PostgreSQL table: use the planner's estimate.

    Only for an unfiltered queryset on PostgreSQL whose estimate is large;
    anything filtered, small or on another database is counted exactly.
    """

    #: Below this many estimated rows, count exactly.
    exact_below = 100_000

    @cached_property
    def count(self) -> int:
        estimate = self._estimate()
        if estimate is not None and estimate >= self.exact_below:
            return estimate
        return super().count

    def _estimate(self) -> int | None:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet) or queryset.query.where:
            return None
        connection = connections[queryset.db]
        if connection.vendor != "postgresql":
            return None
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)",
                [connection.ops.quote_name(queryset.model._meta.db_table)],
            )
            row = cursor.fetchone()
        if row is None or row[0] is None or row[0] < 0:
            return None
        return int(row[0])


# -- rendering ----------------------------------------------------------------


def render_body(body: bytes | memoryview | None) -> SafeString:
    """A stored body for display: pretty JSON, escaped text, or a note for binary data."""
    data = bytes(body or b"")
    if not data:
        return format_html("<em>{}</em>", _("(empty)"))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        preview = data[:BINARY_PREVIEW].hex(" ")
        return format_html(
            "<em>{}</em><br><code>{}{}</code>",
            _("%(count)d bytes, binary (not UTF-8)") % {"count": len(data)},
            preview,
            " …" if len(data) > BINARY_PREVIEW else "",
        )
    with contextlib.suppress(ValueError):
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    note = ""
    if len(text) > BODY_DISPLAY_LIMIT:
        note = _("(cut: showing %(shown)d of %(total)d characters)") % {
            "shown": BODY_DISPLAY_LIMIT,
            "total": len(text),
        }
        text = text[:BODY_DISPLAY_LIMIT]
    return format_html(
        '<pre class="idempotency-body" style="white-space: pre-wrap; max-height: 40em; '
        'overflow: auto; margin: 0">{}</pre>{}',
        text,
        format_html("<em>{}</em>", note) if note else "",
    )


def render_headers(headers: Any) -> SafeString:
    """Stored headers (a list of ``[name, value]``) as an HTML table."""
    pairs = [
        (str(pair[0]), str(pair[1]))
        for pair in headers or []
        if isinstance(pair, (list, tuple)) and len(pair) == 2
    ]
    if not pairs:
        return format_html("<em>{}</em>", _("(none)"))
    rows = format_html_join(
        "\n", "<tr><th scope='row'>{}</th><td>{}</td></tr>", ((n, v) for n, v in pairs)
    )
    return format_html('<table class="idempotency-headers"><tbody>{}</tbody></table>', rows)


def _log_deletions(request: HttpRequest, objects: Sequence[models.Model], message: str) -> None:
    """One admin log entry per deleted object, on Django 4.2 and on 5.1+."""
    user_id = request.user.pk
    manager: Any = LogEntry.objects
    if hasattr(manager, "log_actions"):  # Django 5.1+
        manager.log_actions(
            user_id=user_id, queryset=objects, action_flag=DELETION, change_message=message
        )
        return
    for obj in objects:  # pragma: no cover - Django < 5.1
        manager.log_action(
            user_id=user_id,
            content_type_id=ContentType.objects.get_for_model(obj, for_concrete_model=False).pk,
            object_id=obj.pk,
            object_repr=str(obj),
            action_flag=DELETION,
            change_message=message,
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
    release_confirmation_template: str | None = None

    actions = ["release_reservations"]
    show_full_result_count = False
    if hasattr(admin, "ShowFacets"):  # Django 5.0+: facet counts are a COUNT per choice
        show_facets = admin.ShowFacets.NEVER
    list_per_page = 50
    list_max_show_all = 500
    paginator = EstimatedCountPaginator
    date_hierarchy = "created_at"
    ordering = ("-created_at",)

    # -- permissions --

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Read-only: Django renders the view-only page for users who may view.
        return False

    # -- queries --

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        opts = self.model._meta
        if match is not None and match.url_name == f"{opts.app_label}_{opts.model_name}_changelist":
            queryset = queryset.defer(*self.changelist_defer)
        return queryset

    # -- columns and detail fields --

    @admin.display(description=_("state"), ordering="state")
    def state_display(self, obj: IdempotencyRecord) -> str:
        value = expiry_state(obj.state, obj.expires_at)
        if value == EXPIRED:
            return str(_("expired"))
        return str(State(value).label)

    @admin.display(description=_("response status"), ordering="status_code")
    def status_display(self, obj: IdempotencyRecord) -> Any:
        return obj.status_code

    @admin.display(description=_("response headers"))
    def headers_display(self, obj: IdempotencyRecord) -> SafeString:
        return render_headers(obj.response_headers)

    @admin.display(description=_("response body"))
    def body_display(self, obj: IdempotencyRecord) -> SafeString:
        return render_body(obj.response_body)

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
            with transaction.atomic(using=queryset.db):
                released = list(reservations.select_for_update())
                if released:
                    _log_deletions(request, released, "Released stuck reservation.")
                    self.model._base_manager.using(queryset.db).filter(
                        Q(pk__in=[obj.pk for obj in released]) & Q(state=State.IN_PROGRESS)
                    ).delete()
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
        opts = self.model._meta
        context = {
            **self.admin_site.each_context(request),
            "title": _("Release stuck reservations?"),
            "subtitle": None,
            "opts": opts,
            "app_label": opts.app_label,
            "reservations": [(obj, obj.expires_at <= now) for obj in selected],
            "live_count": sum(1 for obj in selected if obj.expires_at > now),
            "skipped_count": queryset.count() - len(selected),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "action_name": "release_reservations",
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self._release_templates(), context)

    def _release_templates(self) -> list[str]:
        opts = self.model._meta
        names: Iterable[str] = (
            f"admin/{opts.app_label}/{opts.model_name}/release_confirmation.html",
            f"admin/{opts.app_label}/release_confirmation.html",
            "admin/idempotency_django/release_confirmation.html",
        )
        if self.release_confirmation_template:
            return [self.release_confirmation_template, *names]
        return list(names)


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ExpiringRecordAdmin):
    list_display = (
        "key",
        "principal",
        "location",
        "method",
        "path",
        "state_display",
        "status_display",
        "created_at",
        "expires_at",
    )
    list_filter = (
        ExpiryStateFilter,
        StatusClassFilter,
        MethodFilter,
        LocationFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("key", "path", "principal")
    fieldsets = (
        (_("Key"), {"fields": ("key", "principal", "location", "kind")}),
        (_("Request"), {"fields": ("method", "path", "request_id", "fingerprint_display")}),
        (_("State"), {"fields": ("state_display", "created_at", "completed_at", "expires_at")}),
        (_("Stored response"), {"fields": ("status_code", "headers_display", "body_display")}),
    )
    # Everything is read-only; the owner token is never shown.
    readonly_fields = (
        "key",
        "principal",
        "location",
        "kind",
        "method",
        "path",
        "request_id",
        "fingerprint_display",
        "state_display",
        "created_at",
        "completed_at",
        "expires_at",
        "status_code",
        "headers_display",
        "body_display",
    )
    exclude = ("token",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # Webhook deliveries share the table; they have their own page.
        records: QuerySet[Any] = (
            super().get_queryset(request).filter(kind=IdempotencyRecord.Kind.REQUEST)
        )
        return records


class SourceFilter(RecentValuesFilter):
    title = _("source")
    parameter_name = "source"
    field = "source"


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ExpiringRecordAdmin):
    """Accepted (and running) webhook deliveries: read-only, like the records."""

    list_display = (
        "key",
        "source",
        "trigger_display",
        "state_display",
        "run_id_display",
        "created_at",
        "expires_at",
    )
    list_filter = (ExpiryStateFilter, SourceFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("key",)
    fieldsets = (
        (_("Delivery"), {"fields": ("key", "source", "trigger_display", "run_id_display")}),
        (_("State"), {"fields": ("state_display", "created_at", "completed_at", "expires_at")}),
    )
    readonly_fields = (
        "key",
        "source",
        "trigger_display",
        "run_id_display",
        "state_display",
        "created_at",
        "completed_at",
        "expires_at",
    )
    exclude = ("token",)

    @admin.display(description=_("trigger digest"), ordering="principal")
    def trigger_display(self, obj: WebhookDelivery) -> SafeString:
        return format_html("<code>{}</code>", obj.principal.removeprefix(TRIGGER_PREFIX))

    @admin.display(description=_("run id"))
    def run_id_display(self, obj: WebhookDelivery) -> str:
        try:
            stored = json.loads(bytes(obj.response_body or b"") or b"{}")
        except ValueError:
            return ""
        run_id = stored.get("run_id") if isinstance(stored, dict) else None
        return "" if run_id is None else str(run_id)
