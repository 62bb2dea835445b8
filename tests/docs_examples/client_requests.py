"""idempotency_client with requests, as docs/clients.md shows it.

tests/test_client.py runs each function against the example project.
"""

from __future__ import annotations

# --8<-- [start:requests]
import logging
from dataclasses import dataclass
from typing import Any

import requests

from idempotency_client import (
    IdempotentClient,
    RequestRejected,
    RetriesExhausted,
    RetryPolicy,
)


def bookings_api(username: str, password: str) -> IdempotentClient[requests.Response]:
    session = requests.Session()
    session.auth = (username, password)  # the session's auth, cookies and headers are used
    return IdempotentClient(session, policy=RetryPolicy(attempts=5, max_elapsed=30.0))


def book(
    api: IdempotentClient[requests.Response], base_url: str, booking_id: int, slot: str
) -> dict[str, Any]:
    response = api.post(
        f"{base_url}/api/bookings/",
        json={"slot": slot, "customer": "Dana Whitfield"},  # serialized once
        key=f"booking-{booking_id}",  # your operation's id: the same in every retry
        location="portland",  # X-Location-Id
    )
    return response.json()  # 201, the first time or replayed


# --8<-- [end:requests]

# --8<-- [start:errors]
logger = logging.getLogger("bookings.jobs")


@dataclass
class BookingJob:
    id: int
    slot: str


def run_booking_job(
    api: IdempotentClient[requests.Response], base_url: str, job: BookingJob
) -> str:
    """A job queue's handler: "done", "retry later" or "failed" (a person looks)."""
    try:
        book(api, base_url, job.id, job.slot)
    except RetriesExhausted as error:
        # Busy or unreachable: the next run sends the same key (booking-<id>), so
        # if an attempt did run, it gets that attempt's answer.
        logger.info("booking job %s postponed: %s", job.id, error)
        return "retry later"
    except RequestRejected as error:
        # A 4xx, or 409 idempotency_key_reused: two bookings share an id. Neither
        # is fixed by retrying, nor by a new key.
        logger.error("booking job %s rejected: %s (%s)", job.id, error.status, error.code)
        return "failed"
    return "done"


# --8<-- [end:errors]
