"""One contract, every store: the exported StoreContract, run on the database and Redis stores.

Only what differs per store lives here: how to build it, make an entry expire
now, read its remaining lifetime, and make the store unreachable.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import BaseStore, RecordKey, get_store
from idempotency_django.stores.contract import StoreContract
from idempotency_django.stores.redis import RedisStore
from tests.redis_helpers import DOWN_ALIAS, raw_client, redis_store_settings


@pytest.mark.django_db
class TestDatabaseStore(StoreContract):
    @pytest.fixture
    def store(self) -> Iterator[BaseStore]:
        with override_settings(IDEMPOTENCY={"STORE": "database"}):
            yield get_store()

    def expire_now(self, store: BaseStore, key: RecordKey) -> None:
        past = timezone.now() - timedelta(seconds=1)
        updated = IdempotencyRecord.objects.filter(
            principal=key.principal, location=key.location, key=key.key
        ).update(expires_at=past)
        assert updated == 1

    def remaining_seconds(self, store: BaseStore, key: RecordKey) -> float:
        record = IdempotencyRecord.objects.get(
            principal=key.principal, location=key.location, key=key.key
        )
        return (record.expires_at - timezone.now()).total_seconds()

    def unreachable(self, store: BaseStore) -> BaseStore:
        pytest.skip("database outages are covered by the engine tests, not simulated here")

    def forget(self, store: BaseStore, key: RecordKey) -> None:
        # A purge deletes the abandoned row alone.
        IdempotencyRecord.objects.filter(principal=key.principal, key=key.key).delete()

    def test_flags(self, store: BaseStore) -> None:
        assert (store.database_alias, store.expires_by_itself) == ("default", False)


class TestDatabaseStoreWithAsyncClaims(TestDatabaseStore):
    """The same contract with ``async_claim_commit``: PostgreSQL's own INSERT and takeover."""

    @pytest.fixture
    def store(self) -> Iterator[BaseStore]:
        options = {"STORE": "database", "STORE_OPTIONS": {"async_claim_commit": True}}
        with override_settings(IDEMPOTENCY=options):
            yield get_store()


class TestRedisStore(StoreContract):
    @pytest.fixture
    def store(self) -> Iterator[BaseStore]:
        with redis_store_settings():
            yield get_store()

    def expire_now(self, store: BaseStore, key: RecordKey) -> None:
        assert isinstance(store, RedisStore)
        assert raw_client().pexpire(store.redis_key(key), 1)
        time.sleep(0.01)

    def remaining_seconds(self, store: BaseStore, key: RecordKey) -> float:
        assert isinstance(store, RedisStore)
        return float(raw_client().pttl(store.redis_key(key))) / 1000

    def unreachable(self, store: BaseStore) -> BaseStore:
        return RedisStore(cache=DOWN_ALIAS)

    def forget(self, store: BaseStore, key: RecordKey) -> None:
        # Redis expired the key: the entry alone is gone.
        assert isinstance(store, RedisStore)
        raw_client().delete(store.redis_key(key))

    def test_flags(self, store: BaseStore) -> None:
        assert (store.database_alias, store.expires_by_itself) == (None, True)
