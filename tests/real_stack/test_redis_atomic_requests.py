"""The Redis store with ``ATOMIC_REQUESTS``: the view's writes are in the request's
transaction, though the store is not; a failure rolls them back and frees the key."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.test import Client

from tests.redis_helpers import (
    ALIAS,
    REDIS_URL,
    caches_with,
    redis_cache,
    redis_store_settings,
    stored_entries,
)
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

BODY = json.dumps({"slot": "2026-07-30T09:00"})


@pytest.fixture(autouse=True, params=["default", ALIAS])
def redis_store(request: pytest.FixtureRequest, atomic_requests: None) -> Iterator[None]:
    """The store on the project's only cache (named ``default``, like the database), or
    on a cache of its own."""
    alias = request.param
    with redis_store_settings(alias, caches_with(**{alias: redis_cache(REDIS_URL)})):
        yield


def keyed_post(client: Client, url: str, key: str):  # type: ignore[no-untyped-def]
    return client.post(url, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_view_that_writes_then_raises_keeps_no_row(alice_client: Client) -> None:
    alice_client.raise_request_exception = False
    failed = keyed_post(alice_client, "/plain/bookings/?raise=1", "redis-1")
    assert failed.status_code == 500
    assert Booking.objects.count() == 0


def test_a_view_that_writes_then_raises_leaves_its_key_free(alice_client: Client) -> None:
    alice_client.raise_request_exception = False
    assert keyed_post(alice_client, "/plain/bookings/?raise=1", "redis-2").status_code == 500
    assert stored_entries() == {}
    # Any request may use the key now; a kept reservation would answer 409.
    retry = keyed_post(alice_client, "/plain/bookings/", "redis-2")
    assert retry.status_code == 201
    assert "Idempotency-Replayed" not in retry
    assert Booking.objects.count() == 1


def test_a_view_that_succeeds_commits_once_and_replays(alice_client: Client) -> None:
    first = keyed_post(alice_client, "/plain/bookings/", "redis-3")
    retry = keyed_post(alice_client, "/plain/bookings/", "redis-3")
    assert first.status_code == retry.status_code == 201
    assert retry["Idempotency-Replayed"] == "true"
    assert retry.content == first.content
    assert Booking.objects.count() == 1
    [value] = stored_entries().values()
    assert b'"state":"completed"' in value
