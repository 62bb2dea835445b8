"""Stores keep reservations and stored responses; pick one with ``IDEMPOTENCY["STORE"]``."""

from __future__ import annotations

import functools
from typing import Any

from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from idempotency_django.conf import SETTING_NAME, STORE_ALIASES, idempotency_settings
from idempotency_django.stores.base import (
    BaseStore,
    Claim,
    KeyState,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
)

__all__ = [
    "BaseStore",
    "Claim",
    "KeyState",
    "Outcome",
    "RecordKey",
    "RequestInfo",
    "StoreUnavailable",
    "StoredResponse",
    "get_store",
]


@functools.cache
def get_store() -> BaseStore:
    """The configured store, built once (and again after ``override_settings``)."""
    path = STORE_ALIASES.get(idempotency_settings.STORE, idempotency_settings.STORE)
    store_class: type[BaseStore] = import_string(path)
    return store_class(**idempotency_settings.STORE_OPTIONS)


def _rebuild_store(*, setting: str, **kwargs: Any) -> None:
    if setting in (SETTING_NAME, "DATABASES", "CACHES"):
        get_store.cache_clear()


setting_changed.connect(_rebuild_store)
