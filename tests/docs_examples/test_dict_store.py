"""docs/writing-a-store.md's DictStore, proven by the exported store contract."""

# --8<-- [start:contract]
import time

import pytest
from django.test import override_settings

from idempotency_django.stores import get_store
from idempotency_django.stores.contract import StoreContract


class TestDictStore(StoreContract):
    @pytest.fixture
    def store(self):
        path = "tests.docs_examples.dict_store.DictStore"
        with override_settings(IDEMPOTENCY={"STORE": path}):
            yield get_store()

    def expire_now(self, store, key):
        store.entries[key.digest][2] = time.monotonic()

    def remaining_seconds(self, store, key):
        return store.entries[key.digest][2] - time.monotonic()


# --8<-- [end:contract]
