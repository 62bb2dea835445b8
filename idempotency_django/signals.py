"""Signals sent for each decision, so projects can count them (e.g. for metrics).

Every signal is sent with ``sender`` = the store class and these keyword
arguments: ``request``, ``key_digest`` (never the key itself), and the ones
listed per signal.
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
