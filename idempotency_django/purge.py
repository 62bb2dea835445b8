"""Delete what the database store no longer needs: expired records and abandoned reservations.

Usable from code (:func:`purge`) and from cron (``manage.py purge_idempotency_records``).
Each kind of dead row (:data:`KINDS`) goes in batches, so a purge never holds a long
lock while traffic runs: up to ``batch_size`` primary keys in ``expires_at`` order (the
index serves filter and order; each batch resumes where the last one ended), then one
short DELETE of those keys that repeats the kind's filter. A row taken over by a new
claim in between is live again and stays; a row another purge deleted first counts
nothing (counts are what each DELETE reports): purges may run at once, e.g. from cron on
every app server. :func:`purge_principal` deletes every record of one principal instead.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, models, router, transaction
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
State, Kind = IdempotencyRecord.State, IdempotencyRecord.Kind


@dataclass(frozen=True)
class PurgeKind:
    """One kind of dead row: its key in the counts, its name in words, and its filter,
    ``(now, older_than_cutoff) -> Q``, applied again in the DELETE: it must only ever
    match rows nobody needs any more."""

    label: str
    description: str
    filter: Callable[[datetime, datetime | None], Q]
    singular: str

    def count(self, number: int) -> str:
        """``number`` rows of this kind, in words: "1 completed record", "2 completed records"."""
        return f"{number:,} {self.singular if number == 1 else self.description}"


def completed_filter(now: datetime, cutoff: datetime | None) -> Q:
    """Completed records of requests and tasks past their retention; requests' also when
    completed before ``cutoff``. A task's stored result keeps its retention: it is what a
    broker's redelivery gets instead of running the task's work again."""
    dead = Q(expires_at__lte=now)
    if cutoff is not None:
        old = Q(completed_at__lt=cutoff) | Q(completed_at__isnull=True, created_at__lt=cutoff)
        dead |= Q(kind=Kind.REQUEST) & old
    return Q(state=State.COMPLETED) & ~Q(kind=Kind.WEBHOOK) & dead


def deliveries_filter(now: datetime, cutoff: datetime | None) -> Q:
    """Accepted webhook deliveries past ``WEBHOOK_RETENTION``. Never by ``cutoff``: that
    shrinks stored responses, and must not shorten the window in which a provider's
    redelivery is a duplicate (it would run the receiver's work again)."""
    return Q(kind=Kind.WEBHOOK, state=State.COMPLETED, expires_at__lte=now)


def abandoned_filter(now: datetime, cutoff: datetime | None) -> Q:
    """Reservations past their takeover time and the heartbeat's
    :func:`~idempotency_django.protocol.heartbeat.renewal_grace`: never a live one."""
    return Q(state=State.IN_PROGRESS, expires_at__lte=now - renewal_grace())


#: What a purge deletes, in order.
KINDS: tuple[PurgeKind, ...] = (
    PurgeKind("completed", "completed records", completed_filter, "completed record"),
    PurgeKind("deliveries", "webhook deliveries", deliveries_filter, "webhook delivery"),
    PurgeKind("abandoned", "abandoned reservations", abandoned_filter, "abandoned reservation"),
)

_DURATION = re.compile(r"\s*(\d+)\s*([smhdw])\s*", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: The longest duration :func:`parse_duration` takes: a century, which reaches back
#: before any record (past about 2,000 years, before the year 1 no datetime holds).
MAX_DURATION = timedelta(days=36525)


def parse_duration(value: str) -> timedelta:
    """``"90s"``, ``"30m"``, ``"2h"``, ``"7d"`` or ``"2w"`` as a timedelta; ValueError otherwise."""
    match = _DURATION.fullmatch(value)
    if match is None:
        raise ValueError(
            f"Invalid duration {value!r}: use a whole number and a unit, e.g. 90s, 30m, 2h, 7d."
        )
    seconds = int(match[1]) * _UNIT_SECONDS[match[2].lower()]
    if seconds == 0:
        raise ValueError(f"Invalid duration {value!r}: it must be more than zero.")
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"Invalid duration {value!r}: too large, at most 100 years (36525d).")
    return timedelta(seconds=seconds)


def default_database() -> str:
    """The database the configured store writes to, else the router's (a store outside
    the database: its records there are those of webhooks and tasks, or of before)."""
    from idempotency_django.stores import get_store

    # Not a store's ``alias``: the Redis store's is a cache's.
    alias = get_store().database_alias
    return alias if alias is not None else router.db_for_write(IdempotencyRecord)


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

    With ``dry_run`` nothing is deleted and the counts are the rows that would be.
    ``older_than`` also deletes completed records of requests that finished longer ago
    than that, even within their retention (task results and webhook deliveries keep
    theirs). ``on_batch(kind, deleted)`` is called after every batch; ``pause`` seconds
    are slept between batches, to leave the database to traffic.
    """
    _check_batching(batch_size, pause)
    using = using or default_database()
    # The database's clock, as the store's claims use: an app server whose
    # clock runs fast must not delete a reservation that is still live.
    now = now or database_now(using)
    counts: dict[str, int] = {}
    for kind in KINDS:
        rows = dead_rows(kind, using, now, older_than)
        counts[kind.label] = rows.count() if dry_run else 0
        floor: datetime | None = None
        while not dry_run:
            # From the last batch's highest expiry (>=, so ties are not skipped)
            # rather than rescanning the index past rows of other kinds.
            after = rows if floor is None else rows.filter(expires_at__gte=floor)
            keys = list(after.order_by("expires_at").values_list("pk", "expires_at")[:batch_size])
            if not keys:
                break
            floor = keys[-1][1]
            deleted = _delete(rows, [pk for pk, _expiry in keys], using)
            counts[kind.label] += deleted
            if on_batch is not None:
                on_batch(kind, deleted)
            if len(keys) < batch_size:
                break
            time.sleep(pause)
    signals.purged.send(sender=IdempotencyRecord, counts=counts, database=using, dry_run=dry_run)
    return counts


def dead_rows(
    kind: PurgeKind, using: str, now: datetime, older_than: timedelta | None
) -> models.QuerySet[IdempotencyRecord]:
    """The rows of ``kind`` that a purge at ``now`` deletes."""
    try:
        cutoff = None if older_than is None else now - older_than
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
    # No cascades and no signals: one DELETE each, in autocommit its own transaction.
    return sum(
        rows.filter(pk__in=pks[start : start + chunk]).delete()[0]
        for start in range(0, len(pks), chunk)
    )


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

    For an account deletion or an erasure request. Live reservations go too; a request
    still running then may store its response when it finishes, so stop the principal's
    requests first, e.g. by deactivating the account. ``on_batch(records)`` is called in
    each batch's transaction, before its rows are deleted, with the batch's records
    (``pk``, ``key``, ``principal``, ``location`` and ``kind`` loaded), e.g. to log each
    one. With ``dry_run`` nothing is deleted and the count is the rows that would be.
    """
    _check_batching(batch_size, pause)
    using = using or default_database()
    # A principal too long for its column is stored as its digest.
    wanted = {principal, readable_value(principal)}
    rows = IdempotencyRecord._base_manager.using(using).filter(principal__in=wanted)
    # Compared again here: on MySQL/MariaDB the column's collation may ignore
    # case and trailing spaces, and "Tenant:A" is not "tenant:a".
    if dry_run:
        return sum(1 for value in rows.values_list("principal", flat=True) if value in wanted)
    total, floor = 0, None
    while True:
        # No index on principal: walking the primary key from where the last
        # batch ended reads the table once in all, not once a batch.
        with transaction.atomic(using=using):
            batch = list(
                (rows if floor is None else rows.filter(pk__gt=floor))
                .order_by("pk")
                .only("pk", "digest", "key", "principal", "location", "kind")
                .select_for_update()[:batch_size]
            )
            theirs = [record for record in batch if record.principal in wanted]
            if theirs:
                if on_batch is not None:
                    on_batch(theirs)
                total += _delete(rows, [record.pk for record in theirs], using)
                send_evicted(theirs, reason="principal")
        if len(batch) < batch_size:
            return total
        floor = batch[-1].pk
        time.sleep(pause)


def send_evicted(records: Sequence[IdempotencyRecord], *, reason: str, user: Any = None) -> None:
    """Tell receivers of :data:`~idempotency_django.signals.evicted` which records went."""
    if records and signals.evicted.has_listeners(IdempotencyRecord):
        digests = [record.digest[:16] for record in records]
        signals.evicted.send(
            sender=IdempotencyRecord, key_digests=digests, reason=reason, user=user
        )
