"""Looking up a key's state from code, e.g. in a support tool or a reconciliation job."""

from __future__ import annotations

from typing import Any

from idempotency_django.protocol.scope import principal_of
from idempotency_django.stores import KeyState, RecordKey, get_store

__all__ = ["KeyState", "lookup"]


def lookup(
    key: str, *, user: Any = None, principal: str | None = None, location: str = ""
) -> KeyState | None:
    """The state of ``key`` for ``user`` (or ``principal``) in ``location``, or None.

    None when the key is free or its entry expired. Otherwise its
    [`KeyState`][idempotency_django.stores.base.KeyState]: ``state`` ("in_progress"
    or "completed"), the stored ``status``, and ``expires_in`` seconds. The
    stored body is never returned. Raises
    ``idempotency_django.stores.StoreUnavailable`` when the store fails.
    """
    if principal is None:
        principal = principal_of(user)
    if principal is None:
        raise ValueError("lookup() needs an authenticated user or a principal.")
    return get_store().lookup(RecordKey(principal, location, key))
