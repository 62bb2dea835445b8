from __future__ import annotations

import time

from idempotency_django.stores import Claim, RecordKey, RequestInfo
from idempotency_django.stores.database import DatabaseStore

#: How long a claim takes after its row is written: a client may hang up meanwhile.
CLAIM_REPLY_SECONDS = 0.8


class SlowClaimStore(DatabaseStore):
    """The database store, answering a claim as slowly as a remote database may."""

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        claim = super().claim(key, request, lock_timeout)
        time.sleep(CLAIM_REPLY_SECONDS)
        return claim
