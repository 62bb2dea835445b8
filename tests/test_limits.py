"""Storage is bounded: response size, keys per principal, principals of any length."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.test import Client, override_settings

from idempotency_django.checks import check_settings
from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import RecordKey, get_store
from idempotency_django.stores.database import DatabaseStore
from tests.redis_helpers import caches_with, raw_client, redis_store_settings, stored_entries
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

BODY = json.dumps({"slot": "2026-07-30T09:00:00Z"})


def post(client: Client, url: str, key: str):  # type: ignore[no-untyped-def]
    return client.post(url, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "redis":
        with redis_store_settings():
            yield "redis"
    else:
        yield "database"


def stored_sizes(store: str) -> list[int]:
    if store == "redis":
        return [len(value) for value in stored_entries().values()]
    return [len(bytes(r.response_body)) for r in IdempotencyRecord.objects.all()]


def test_a_response_over_the_limit_is_not_kept_and_never_runs_twice(
    alice_client: Client, store: str
) -> None:
    """Default limit 1 MiB: a 2 MiB answer reaches the client once, then the retry is told."""
    url = "/plain/large/?size=2097152"
    first = post(alice_client, url, "big-1")
    assert first.status_code == 201
    assert len(first.content) > 2 * 1024 * 1024
    retry = post(alice_client, url, "big-1")
    assert retry.status_code == 409
    problem = retry.json()
    assert problem["code"] == "idempotency_response_not_stored"
    assert problem["original_status"] == 201
    assert "Idempotency-Replayed" not in retry
    assert Booking.objects.count() == 1
    assert max(stored_sizes(store)) < 1024  # the body was not stored


def test_a_view_sets_its_own_limit(alice_client: Client, store: str) -> None:
    assert post(alice_client, "/plain/small-limit/", "small-1").status_code == 201
    assert post(alice_client, "/plain/small-limit/", "small-1").status_code == 409
    # Under the limit, a response is replayed as always.
    with override_settings(IDEMPOTENCY={**current(store), "MAX_STORED_BODY": 10**6}):
        assert post(alice_client, "/plain/large/?size=10", "fits")
        assert post(alice_client, "/plain/large/?size=10", "fits")["Idempotency-Replayed"] == "true"


def current(store: str) -> dict[str, object]:
    from django.conf import settings

    return dict(getattr(settings, "IDEMPOTENCY", {}))


def test_redis_without_a_limit_is_flagged() -> None:
    redis = {"STORE": "redis", "STORE_OPTIONS": {"cache": "idempotency"}}
    with override_settings(CACHES=caches_with(), IDEMPOTENCY={**redis, "MAX_STORED_BODY": None}):
        assert "idempotency_django.W021" in {m.id for m in check_settings()}
    with override_settings(CACHES=caches_with(), IDEMPOTENCY=redis):
        assert "idempotency_django.W021" not in {m.id for m in check_settings()}


@pytest.mark.parametrize(
    ("value", "check"), [(0, "E024"), (-1, "E024"), ("1MB", "E004"), (True, "E004")]
)
def test_limits_must_be_positive_integers(value: object, check: str) -> None:
    for name in ("MAX_STORED_BODY", "MAX_KEYS_PER_PRINCIPAL"):
        with override_settings(IDEMPOTENCY={name: value}):
            assert f"idempotency_django.{check}" in {m.id for m in check_settings()}


def test_a_principal_holds_at_most_max_keys(
    alice_client: Client, bob_client: Client, store: str
) -> None:
    with override_settings(IDEMPOTENCY={**current(store), "MAX_KEYS_PER_PRINCIPAL": 2}):
        assert post(alice_client, "/plain/bookings/", "a").status_code == 201
        assert post(alice_client, "/plain/bookings/", "b").status_code == 201
        third = post(alice_client, "/plain/bookings/", "c")
        assert third.status_code == 429
        assert third.json()["code"] == "idempotency_too_many_keys"
        # Until the first of alice's keys expires, a day from now.
        assert 86000 < int(third["Retry-After"]) <= 86400 + 300
        assert Booking.objects.count() == 2  # the third did not run
        # Her retries are never refused, and bob has keys of his own.
        assert post(alice_client, "/plain/bookings/", "a")["Idempotency-Replayed"] == "true"
        assert post(bob_client, "/plain/bookings/", "c").status_code == 201
        assert Booking.objects.count() == 3


def test_a_released_key_no_longer_counts(alice_client: Client, store: str) -> None:
    alice_client.raise_request_exception = False
    with override_settings(IDEMPOTENCY={**current(store), "MAX_KEYS_PER_PRINCIPAL": 1}):
        assert post(alice_client, "/plain/bookings/?raise=1", "failed").status_code == 500
        assert post(alice_client, "/plain/bookings/", "next").status_code == 201
        assert post(alice_client, "/plain/bookings/", "more").status_code == 429


def test_a_principal_of_any_length_is_stored_safely(alice_client: Client, store: str) -> None:
    """276 characters and more: hashed where it does not fit, never an error."""
    scope = "tests.testapp.views.long_principal_scope"
    with override_settings(IDEMPOTENCY={**current(store), "SCOPE_FUNCTION": scope}):
        assert post(alice_client, "/plain/bookings/", "long-1").status_code == 201
        assert post(alice_client, "/plain/bookings/", "long-1")["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1
    if store == "database":
        record = IdempotencyRecord.objects.get()
        assert record.principal.startswith("sha256:") and len(record.principal) == 71
    else:
        assert raw_client().dbsize() >= 1


class StoreThatCannotCount(DatabaseStore):
    """A project's own store: it implements the contract, not ``count_keys``."""

    counts_keys = False

    def count_keys(self, key: RecordKey, lifetime: int) -> tuple[int, float | None]:
        raise NotImplementedError


@pytest.mark.django_db
def test_a_store_that_cannot_count_keys_works_under_a_limit(
    alice_client: Client,
) -> None:
    """MAX_KEYS_PER_PRINCIPAL set; a store without ``count_keys`` still serves."""
    cannot_count = {"STORE": f"{__name__}.StoreThatCannotCount", "MAX_KEYS_PER_PRINCIPAL": 2}
    with override_settings(IDEMPOTENCY=cannot_count):
        get_store.cache_clear()
        try:
            first = alice_client.post(
                "/plain/bookings/", "{}", content_type="application/json",
                HTTP_IDEMPOTENCY_KEY="no-count-1",
            )  # fmt: skip
            retry = alice_client.post(
                "/plain/bookings/", "{}", content_type="application/json",
                HTTP_IDEMPOTENCY_KEY="no-count-1",
            )  # fmt: skip
        finally:
            get_store.cache_clear()
    assert (first.status_code, retry.status_code) == (201, 201)
    assert retry["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1
