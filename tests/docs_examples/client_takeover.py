"""A retry budget that outlasts a crashed request's reservation, as docs/clients.md shows it.

tests/test_client_budget.py plays it against a server whose key is held by a request
that died, until LOCK_TIMEOUT lets the retry take it over.
"""

from __future__ import annotations

# --8<-- [start:takeover]
from idempotency_client import RetryPolicy

# The server's IDEMPOTENCY settings (these are the defaults).
LOCK_TIMEOUT = 300  # seconds before a crashed request's reservation is taken over
RETRY_AFTER = 1  # the Retry-After of 409 idempotency_key_in_progress

# Keep retrying until the reservation can be taken over, plus a margin: one attempt per
# Retry-After, so as many attempts as fit in that time.
TAKEOVER_MARGIN = 30.0
takeover_policy = RetryPolicy(
    max_elapsed=LOCK_TIMEOUT + TAKEOVER_MARGIN,
    attempts=int((LOCK_TIMEOUT + TAKEOVER_MARGIN) / RETRY_AFTER) + 1,
)
# --8<-- [end:takeover]
