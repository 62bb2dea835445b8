"""Signals sent for each decision, so projects can count them (e.g. for metrics).

The decisions on requests are sent with ``sender`` = the store class and
these keyword arguments: ``request``, ``key_digest`` (never the key itself),
and the ones listed per signal. [`purged`][idempotency_django.signals.purged] and
[`evicted`][idempotency_django.signals.evicted], about
records the database store holds, are sent by ``IdempotencyRecord``.
"""

from __future__ import annotations

from django.dispatch import Signal

#: A key was claimed and the view is about to run.
reserved = Signal()
#: A stored response was replayed. Extra: ``status``.
replayed = Signal()
#: A request was refused because of its key. Extra: ``code``
#: (``idempotency_key_reused`` or ``idempotency_key_in_progress``).
conflict = Signal()
#: A response was stored for replay. Extra: ``status``.
stored = Signal()
#: A reservation was given up so a retry can run. Extra: ``status`` (None
#: when the view raised) and ``reason``.
released = Signal()
#: The store could not be reached to claim a key. Extra: ``error``.
unavailable = Signal()

#: The purge deleted expired records (``purge_idempotency_records`` or
#: ``idempotency_django.purge.purge``). Extra: ``counts`` (rows per kind:
#: "completed", "abandoned", "webhook deliveries"), ``database``, ``dry_run``
#: (True: the counts are what would have gone).
purged = Signal()
#: Records were removed by hand: evicted or released in the admin, or all of
#: one principal's purged. Extra: ``key_digests`` (the logs' digest of each
#: record), ``reason`` ("evict", "release" or "principal"), ``user`` (the
#: admin who did it, or None).
evicted = Signal()
