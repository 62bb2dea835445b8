"""The records' changelists on a table of millions of rows: list filters whose choices come
from settings or the newest rows (never a ``DISTINCT`` scan), a paginator that skips
``COUNT(*)`` of a whole big PostgreSQL table, and a changelist that loads no bodies.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections, models
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.translation import gettext_lazy as _

from idempotency_django.admin.display import principal_usernames
from idempotency_django.conf import DEFAULTS, idempotency_settings
from idempotency_django.models import IdempotencyRecord

IN_PROGRESS = str(IdempotencyRecord.State.IN_PROGRESS)
COMPLETED = str(IdempotencyRecord.State.COMPLETED)
EXPIRED = "expired"


def expiry_state(state: str, expires_at: datetime, now: datetime | None = None) -> str:
    """``"in_progress"``, ``"completed"``, or ``"expired"`` once past ``expires_at``."""
    return EXPIRED if expires_at <= (now or timezone.now()) else state


class ChoicesFilter(admin.SimpleListFilter):
    """A list filter whose choices each stand for a condition (:meth:`conditions`):
    a value it does not know (from an old bookmark, say) filters nothing out."""

    def conditions(self) -> dict[str, tuple[Any, Q]]:
        """``{value: (label, condition)}``."""
        raise NotImplementedError

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, Any]]:
        return [(value, label) for value, (label, _q) in self.conditions().items()]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[models.Model]
    ) -> QuerySet[models.Model] | None:
        chosen = self.conditions().get(self.value() or "")
        return queryset if chosen is None else queryset.filter(chosen[1])


class ExpiryStateFilter(ChoicesFilter):
    """In progress / completed / expired: a row past ``expires_at`` counts as absent to the
    store, whatever its state, so it is "expired" here and neither of the others."""

    title = _("state")
    parameter_name = "state"

    def conditions(self) -> dict[str, tuple[Any, Q]]:
        now = timezone.now()
        return {
            IN_PROGRESS: (_("in progress"), Q(state=IN_PROGRESS, expires_at__gt=now)),
            COMPLETED: (_("completed"), Q(state=COMPLETED, expires_at__gt=now)),
            EXPIRED: (_("expired"), Q(expires_at__lte=now)),
        }


class StatusClassFilter(ChoicesFilter):
    """The stored response's status class: 2xx, 3xx, 4xx, 5xx, or none yet."""

    title = _("status class")
    parameter_name = "status_class"
    CLASSES = {
        2: _("2xx success"),
        3: _("3xx redirection"),
        4: _("4xx client error"),
        5: _("5xx server error"),
    }

    def conditions(self) -> dict[str, tuple[Any, Q]]:
        return {
            **{
                f"{n}xx": (label, Q(status_code__gte=n * 100, status_code__lt=n * 100 + 100))
                for n, label in self.CLASSES.items()
            },
            "none": (_("no response yet"), Q(status_code__isnull=True)),
        }


class ValueFilter(admin.SimpleListFilter):
    """Rows whose ``field`` is the chosen value, listed among the choices or not."""

    field = ""

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[models.Model]
    ) -> QuerySet[models.Model] | None:
        value = self.value()
        return queryset if value is None else queryset.filter(**{self.field: value})


class MethodFilter(ValueFilter):
    """The HTTP method, its choices from the protected methods setting: no DISTINCT scan."""

    title = _("method")
    parameter_name = field = "method"

    def value(self) -> str | None:
        return (super().value() or "").upper() or None

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, Any]]:
        order = [str(method) for method in DEFAULTS["METHODS"]]
        methods = sorted(
            idempotency_settings.METHODS,
            key=lambda m: (order.index(m) if m in order else len(order), m),
        )
        return [(method, method) for method in methods]


class RecentValuesFilter(ValueFilter):
    """The choices: the distinct values of ``field`` among the newest ``sample_size`` rows.

    Django's default filter for a plain field runs ``SELECT DISTINCT`` over the whole
    table, a full scan on millions of rows; this reads the newest rows by primary key.
    """

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


class LocationFilter(RecentValuesFilter):
    title = _("location")
    parameter_name = field = "location"


class SourceFilter(RecentValuesFilter):
    """Where a webhook delivery's identity came from (a provider, "body", "fallback")."""

    title = _("source")
    parameter_name = field = "source"


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Skip ``COUNT(*)`` of a whole big PostgreSQL table: use the planner's estimate.

    Only for an unfiltered queryset on PostgreSQL whose estimate is large; anything
    filtered, small or on another database is counted exactly.
    """

    #: Below this many estimated rows, count exactly.
    exact_below = 100_000
    #: The admin's own rows before any filter or search (its ``get_queryset``), set by
    #: the admin: a page of those is unfiltered too. Each of this app's admins lists
    #: one kind of row, so its queryset always has a WHERE.
    unfiltered: QuerySet[Any] | None = None

    @cached_property
    def count(self) -> int:
        estimate = self._estimate()
        if estimate is not None and estimate >= self.exact_below:
            return estimate
        return super().count

    def _estimate(self) -> int | None:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet) or connections[queryset.db].vendor != "postgresql":
            return None
        where = queryset.query.where
        if where and (self.unfiltered is None or where != self.unfiltered.query.where):
            return None
        # The planner's estimate of the rows, from the table's statistics: no scan.
        plan = json.loads(queryset.order_by().explain(format="json"))
        return int(plan[0]["Plan"]["Plan Rows"])


class RecordChangeList(ChangeList):
    """The records' changelist: the stored bodies and headers are not loaded, and the users
    behind the page's principals are named in one query."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        queryset = super().get_queryset(request, exclude_parameters)
        return queryset.defer("response_body", "response_headers")

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        names = principal_usernames({obj.principal for obj in self.result_list})
        for obj in self.result_list:
            obj.principal_username = names.get(obj.principal)
