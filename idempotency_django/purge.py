"""Delete what the database store no longer needs: expired records and abandoned reservations.

Usable from code (:func:`purge`) and from cron (``manage.py purge_idempotency_records``).

Rows go in bounded batches: select up to ``batch_size`` primary keys in
``expires_at`` order (the ``expires_at`` index serves both the filter and the
order; each batch resumes where the last one ended), then delete those keys,
each batch in its own short statement, so a purge never holds a long lock
while traffic runs. The delete repeats the
expiry filter, so a row taken over by a new claim between the select and the
delete (it is live again) is left alone, and a row another purge deleted
first just counts nothing: counts are the rows each DELETE reports. Several
purges may therefore run at once, e.g. from cron on every app server.

The rows to purge come in three kinds (:data:`KINDS`): completed records
(requests' and background tasks' stored answers), accepted webhook
deliveries and abandoned reservations, each counted on its own.

:func:`purge_principal` is the other purge: every record of one principal,
live or not, e.g. when a user's account is deleted.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, models, router, transaction
from django.db.models import Q

from idempotency_django import signals
from idempotency_django.models import IdempotencyRecord
from idempotency_django.protocol.heartbeat import renewal_grace
from idempotency_django.stores.digests import readable_value

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "KINDS",
    "MAX_DURATION",
    "PurgeKind",
    "dead_rows",
    "default_database",
    "parse_duration",
    "purge",
    "purge_principal",
]

DEFAULT_BATCH_SIZE = 5000


@dataclass(frozen=True)
class PurgeKind:
    """One kind of dead record: the filter selecting it, and its name in counts."""

    #: Key in the result.
    label: str
    #: What the command prints after the count.
    description: str
    #: ``(now, older_than_cutoff) -> Q``. Must only ever match rows nobody
    #: needs any more: it is applied again in the DELETE itself.
    filter: Callable[[datetime, datetime | None], Q]
    #: ``description`` for one row.
    singular: str

    def count(self, number: int) -> str:
        """``number`` rows of this kind, in words: "1 completed record", "2 completed records"."""
        return f"{number:,} {self.singular if number == 1 else self.description}"


def _completed_and_dead(now: datetime, cutoff: datetime | None) -> Q:
    dead = Q(expires_at__lte=now)
    if cutoff is not None:
        dead |= Q(completed_at__lt=cutoff) | Q(completed_at__isnull=True, created_at__lt=cutoff)
    return Q(state=IdempotencyRecord.State.COMPLETED) & dead


def completed_filter(now: datetime, cutoff: datetime | None) -> Q:
    """Completed records of requests and tasks past their retention; requests' also
    when older than ``cutoff``.

    A task's stored result keeps its own retention whatever ``cutoff``: it is what a
    redelivery of the task (brokers deliver at least once) gets instead of running
    the task's work again, as a webhook delivery's record is.
    """
    # Every kind but webhook deliveries, which are counted apart: a task's
    # stored result (kind "task") expires after its retention like a response.
    dead = _completed_and_dead(now, None)
    if cutoff is not None:
        dead |= Q(kind=IdempotencyRecord.Kind.REQUEST) & _completed_and_dead(now, cutoff)
    return ~Q(kind=IdempotencyRecord.Kind.WEBHOOK) & dead


def deliveries_filter(now: datetime, cutoff: datetime | None) -> Q:
    """Accepted webhook deliveries past their retention (``WEBHOOK_RETENTION``, 7 days).

    Never by ``cutoff``: ``older_than`` shrinks the stored responses (after
    lowering ``RETENTION``), and must not shorten the window in which a
    provider's redelivery is a duplicate: it would run the receiver's work again.
    """
    return Q(kind=IdempotencyRecord.Kind.WEBHOOK) & _completed_and_dead(now, None)


def abandoned_filter(now: datetime, cutoff: datetime | None) -> Q:
    """Reservations past their takeover time (and
    :func:`~idempotency_django.protocol.heartbeat.renewal_grace`). A live reservation is never
    matched."""
    return Q(state=IdempotencyRecord.State.IN_PROGRESS, expires_at__lte=now - renewal_grace())


#: What a purge deletes, in order.
KINDS: tuple[PurgeKind, ...] = (
    PurgeKind("completed", "completed records", completed_filter, "completed record"),
    PurgeKind("deliveries", "webhook deliveries", deliveries_filter, "webhook delivery"),
    PurgeKind("abandoned", "abandoned reservations", abandoned_filter, "abandoned reservation"),
)

_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
#: The longest duration :func:`parse_duration` takes: a century. Anything longer
#: reaches back before any record (and, past about 2,000 years, before the year 1,
#: which no datetime can hold).
MAX_DURATION = timedelta(days=36525)


def parse_duration(value: str) -> timedelta:
    """``"90s"``, ``"30m"``, ``"2h"``, ``"7d"`` or ``"2w"`` as a timedelta; ValueError otherwise."""
    match = _DURATION.match(value)
    if match is None:
        raise ValueError(
            f"Invalid duration {value!r}: use a whole number and a unit, e.g. 90s, 30m, 2h, 7d."
        )
    amount = int(match.group(1))
    if amount <= 0:
        raise ValueError(f"Invalid duration {value!r}: it must be more than zero.")
    try:
        duration = timedelta(**{_UNITS[match.group(2).lower()]: amount})
    except OverflowError as exc:
        raise ValueError(f"Invalid duration {value!r}: too large.") from exc
    if duration > MAX_DURATION:
        raise ValueError(f"Invalid duration {value!r}: too large, at most 100 years (36525d).")
    return duration


def default_database() -> str:
    """The alias the configured store writes to (``DatabaseStore.alias``), else the router's."""
    from idempotency_django.stores import get_store

    alias = getattr(get_store(), "alias", None)
    if isinstance(alias, str):
        return alias
    return router.db_for_write(IdempotencyRecord) or DEFAULT_DB_ALIAS


def database_now(using: str) -> datetime:
    """The current time on the database ``using``."""
    from idempotency_django.stores.database import DatabaseStore

    return DatabaseStore(database=using).now()


def purge(
    *,
    using: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    older_than: timedelta | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
    on_batch: Callable[[PurgeKind, int], None] | None = None,
    pause: float = 0.0,
) -> dict[str, int]:
    """Delete dead rows of every kind; return the count deleted per kind label.

    With ``dry_run`` nothing is deleted and the counts are the rows that
    would be. ``older_than`` also deletes completed records of requests that
    finished longer ago than that, even when still within their retention
    (task results and webhook deliveries keep theirs).
    ``on_batch(kind, deleted)`` is called after every batch. ``pause``
    seconds are slept between batches, to leave the database to traffic.
    """
    _check_batching(batch_size, pause)
    using = using or default_database()
    # The database's clock, as the store's claims use: an app server whose
    # clock runs fast must not delete a reservation that is still live.
    now = now or database_now(using)
    counts: dict[str, int] = {}
    for kind in KINDS:
        rows = dead_rows(kind, using, now, older_than)
        if dry_run:
            counts[kind.label] = rows.count()
            continue
        total = 0
        floor: datetime | None = None
        while True:
            # Resume from the last batch's highest expiry (>=, so ties are not
            # skipped) rather than rescanning the index past rows of other kinds.
            batch_rows = rows if floor is None else rows.filter(expires_at__gte=floor)
            batch = list(
                batch_rows.order_by("expires_at").values_list("pk", "expires_at")[:batch_size]
            )
            if not batch:
                break
            pks = [pk for pk, _value in batch]
            floor = batch[-1][1]
            deleted = _delete(rows, pks, using)
            total += deleted
            if on_batch is not None:
                on_batch(kind, deleted)
            if len(pks) < batch_size:
                break
            if pause:
                time.sleep(pause)
        counts[kind.label] = total
    signals.purged.send(sender=IdempotencyRecord, counts=counts, database=using, dry_run=dry_run)
    return counts


def dead_rows(
    kind: PurgeKind, using: str, now: datetime, older_than: timedelta | None
) -> models.QuerySet[IdempotencyRecord]:
    """The rows of ``kind`` that a purge at ``now`` deletes."""
    cutoff = None
    if older_than is not None:
        try:
            cutoff = now - older_than
        except OverflowError:
            raise ValueError(f"older_than={older_than} reaches back before the year 1.") from None
    return IdempotencyRecord._base_manager.using(using).filter(kind.filter(now, cutoff))


def _check_batching(batch_size: int, pause: float) -> None:
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1.")
    if pause < 0:
        raise ValueError("pause must not be negative.")


def _delete(rows: models.QuerySet[IdempotencyRecord], pks: list[int], using: str) -> int:
    """Delete the rows among ``pks`` that still match; return how many went."""
    # SQLite caps the parameters of one statement; PostgreSQL takes the batch whole.
    chunk = connections[using].ops.bulk_batch_size(["pk"], pks) or len(pks)
    deleted = 0
    for start in range(0, len(pks), chunk):
        # No cascades and no signals: Django issues one DELETE, in autocommit
        # its own transaction, and reports the rows it removed.
        count, _per_model = rows.filter(pk__in=pks[start : start + chunk]).delete()
        deleted += count
    return deleted


def purge_principal(
    principal: str,
    *,
    using: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    on_batch: Callable[[Sequence[IdempotencyRecord]], None] | None = None,
    pause: float = 0.0,
) -> int:
    """Delete every record of ``principal`` (requests and deliveries, live or not); return how many.

    For an account deletion or an erasure request. Live reservations go too;
    a request still running then may store its response when it finishes
    (the store keeps the answer of work that ran when nobody claimed the key
    since), so stop the principal's requests first, e.g. by deactivating the
    account. ``on_batch(records)`` is called in each batch's
    transaction, before its rows are deleted, with the batch's records
    (``pk``, ``key``, ``principal``, ``location`` and ``kind`` loaded), e.g.
    to log each one. With ``dry_run`` nothing is deleted and the count is
    the rows that would be.
    """
    _check_batching(batch_size, pause)
    using = using or default_database()
    wanted = set(stored_principals(principal))
    rows = IdempotencyRecord._base_manager.using(using).filter(principal__in=wanted)
    # Rows are compared again here: on MySQL/MariaDB the column's collation
    # may ignore case and trailing spaces, and "Tenant:A" is not "tenant:a".
    if dry_run:
        return sum(1 for value in rows.values_list("principal", flat=True) if value in wanted)
    total = 0
    floor: object = None
    while True:
        # There is no index on principal: walking the primary key from where
        # the last batch ended reads the table once in all, not once a batch.
        batch_rows = rows if floor is None else rows.filter(pk__gt=floor)
        with transaction.atomic(using=using):
            batch = list(
                batch_rows.order_by("pk")
                .only("pk", "digest", "key", "principal", "location", "kind")
                .select_for_update()[:batch_size]
            )
            if not batch:
                break
            theirs = [record for record in batch if record.principal in wanted]
            if theirs:
                if on_batch is not None:
                    on_batch(theirs)
                total += _delete(rows, [record.pk for record in theirs], using)
                send_evicted(theirs, reason="principal")
        floor = batch[-1].pk
        if len(batch) < batch_size:
            break
        if pause:
            time.sleep(pause)
    return total


def send_evicted(records: Sequence[IdempotencyRecord], *, reason: str, user: Any = None) -> None:
    """Tell receivers of :data:`~idempotency_django.signals.evicted` which records went."""
    if records and signals.evicted.has_listeners(IdempotencyRecord):
        digests = [record.digest[:16] for record in records]
        signals.evicted.send(
            sender=IdempotencyRecord, key_digests=digests, reason=reason, user=user
        )


def stored_principals(principal: str) -> list[str]:
    """The values the ``principal`` column may hold for ``principal``.

    The database store keeps a principal too long for the column as
    ``sha256:<hex>`` of it, so that one is looked for as well.
    """
    return sorted({principal, readable_value(principal)})
