"""idempotency_client with httpx, as docs/clients.md shows it.

tests/test_client.py runs each function against the example project.
"""

from __future__ import annotations

# --8<-- [start:httpx]
from typing import Any

import httpx

from idempotency_client import AsyncIdempotentClient, IdempotentClient


def book_with_httpx(base_url: str, auth: tuple[str, str], booking_id: int, slot: str) -> Any:
    with httpx.Client(base_url=base_url, auth=auth, timeout=10.0) as client:
        response = IdempotentClient(client).post(
            "/api/bookings/",
            json={"slot": slot, "customer": "Dana Whitfield"},
            key=f"booking-{booking_id}",
            location="portland",
        )
    return response.json()


async def book_async(base_url: str, auth: tuple[str, str], booking_id: int, slot: str) -> Any:
    async with httpx.AsyncClient(base_url=base_url, auth=auth) as client:
        response = await AsyncIdempotentClient(client).post(
            "/api/bookings/",
            json={"slot": slot, "customer": "Dana Whitfield"},
            key=f"booking-{booking_id}",
            location="portland",
        )
    return response.json()


# --8<-- [end:httpx]
