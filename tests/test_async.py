"""Async views: Django's AsyncClient, and a real ASGI server (uvicorn) under a storm."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.test import AsyncClient

from idempotency_django.models import IdempotencyRecord
from tests import servers
from tests.checkpoints import Checkpoint
from tests.testapp.models import Booking

BODY = json.dumps({"slot": "2026-07-30T09:00:00Z"})


async def apost(  # type: ignore[no-untyped-def]
    client: AsyncClient, url: str, key: str | None = "async-1", body: str = BODY, pause_at: str = ""
):
    """``pause_at``: the view waits at that checkpoint (tests/checkpoints.py)."""
    headers = {"Idempotency-Key": key} if key is not None else {}
    if pause_at:
        headers["X-Pause-At"] = pause_at
    return await client.post(url, body, content_type="application/json", headers=headers)


@pytest.fixture
def aclient(alice: User) -> AsyncClient:
    client = AsyncClient()
    client.force_login(alice)
    return client


@pytest.mark.django_db
def test_async_view_through_async_middleware(aclient: AsyncClient) -> None:
    async def scenario():  # type: ignore[no-untyped-def]
        first = await apost(aclient, "/async/bookings/")
        replay = await apost(aclient, "/async/bookings/")
        reused = await apost(aclient, "/async/bookings/", body="{}")
        return first, replay, reused

    first, replay, reused = async_to_sync(scenario)()
    assert first.status_code == 201
    assert replay["Idempotency-Replayed"] == "true"
    assert replay.content == first.content
    assert reused.json()["code"] == "idempotency_key_reused"
    assert Booking.objects.count() == 1


@pytest.mark.django_db
def test_sync_view_under_asgi_is_protected(aclient: AsyncClient) -> None:
    async def scenario():  # type: ignore[no-untyped-def]
        await apost(aclient, "/plain/bookings/")
        return await apost(aclient, "/plain/bookings/")

    assert async_to_sync(scenario)()["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url", ["/async/decorated/", "/async/decorated-cbv/"], ids=["function", "class-based"]
)
def test_decorated_async_view(aclient: AsyncClient, url: str) -> None:
    async def scenario():  # type: ignore[no-untyped-def]
        missing = await apost(aclient, url, key=None)
        failed = await apost(aclient, f"{url}?status=503")
        first = await apost(aclient, url)
        replay = await apost(aclient, url)
        return missing, failed, first, replay

    missing, failed, first, replay = async_to_sync(scenario)()
    assert missing.json()["code"] == "idempotency_key_missing"
    assert failed.status_code == 503
    assert first.status_code == 201
    assert replay["Idempotency-Replayed"] == "true"
    assert Booking.objects.filter(slot="decorated-async").count() == 2  # the 503 and the 201


@pytest.mark.django_db
def test_async_view_under_wsgi(alice_client) -> None:  # type: ignore[no-untyped-def]
    for _ in range(2):
        response = alice_client.post(
            "/async/bookings/", BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY="w"
        )
    assert response["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1


@pytest.mark.django_db
def test_concurrent_async_requests_run_once(aclient: AsyncClient) -> None:
    """Ten at once on one event loop; the one that claims the key waits in its view
    until the nine others have their answers."""

    async def storm():  # type: ignore[no-untyped-def]
        with Checkpoint("storm"):
            sent = [
                asyncio.ensure_future(apost(aclient, "/async/bookings/", "storm", pause_at="storm"))
                for _ in range(10)
            ]
            deadline = asyncio.get_running_loop().time() + 30
            while sum(request.done() for request in sent) < 9:
                assert asyncio.get_running_loop().time() < deadline, "the duplicates waited"
                await asyncio.sleep(0.01)
        return await asyncio.gather(*sent)  # the first goes on

    responses = async_to_sync(storm)()
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(201) == 1 and statuses.count(409) == 9, statuses
    assert Booking.objects.count() == 1


@pytest.fixture
def uvicorn_server(transactional_db: None) -> Iterator[str]:
    with servers.test_project_on_uvicorn() as url:
        yield url


def test_same_key_storm_against_a_real_asgi_server(uvicorn_server: str, django_user_model) -> None:  # type: ignore[no-untyped-def]
    user = django_user_model.objects.create_user("storm", password="pw")
    logged_in = servers.logged_in_headers(user)

    def send(_: int) -> tuple[int, dict[str, str], bytes]:
        return servers.post(
            uvicorn_server + "/async/bookings/?delay=0.5",
            BODY.encode(),
            {"Content-Type": "application/json", "Idempotency-Key": "uvicorn-storm", **logged_in},
        )

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(send, range(16)))
    statuses = [status for status, _, _ in results]
    assert all(status in (201, 409) for status in statuses), statuses
    assert statuses.count(201) >= 1
    originals = [
        body
        for status, headers, body in results
        if status == 201 and "Idempotency-Replayed" not in headers
    ]
    assert len(originals) == 1
    assert Booking.objects.count() == 1
    assert IdempotencyRecord.objects.get().state == "completed"
