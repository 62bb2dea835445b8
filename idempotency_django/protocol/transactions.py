"""The database transactions around a protected view.

With ``atomic`` (the option or the ``ATOMIC`` setting) phase 1, the view and
phase 2 run in one transaction (:func:`transaction_block`). Whatever opened
them, the phases look at the transactions open around the view
(:func:`open_transactions`) to decide when an answer may be stored, and mark
them for rollback when the work must not commit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.options import ViewOptions, option
from idempotency_django.stores import get_store

#: The transaction to run phase 1, the view and phase 2 in (or none).
Block = Callable[[], contextlib.AbstractContextManager[Any]]


def transaction_block(options: ViewOptions) -> Block:
    """One transaction around claim, view and completion with ``atomic``; else none."""
    atomic = option(options.atomic, idempotency_settings.ATOMIC)
    return atomic_block if atomic else contextlib.nullcontext


def atomic_block() -> Any:
    """A transaction on the store's database (the default database for other stores)."""
    return transaction.atomic(using=get_store().database_alias or DEFAULT_DB_ALIAS)


def open_transactions() -> list[str]:
    """The databases with a transaction open around the view (test cases' own aside)."""
    return [
        connection.alias
        for connection in connections.all(initialized_only=True)
        if any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)
    ]


#: libpq's PQTransactionStatus for a transaction an error aborted (psycopg 2 and 3 alike).
PQTRANS_INERROR = 3


def will_roll_back(alias: str) -> bool:
    """The transaction open on ``alias`` cannot commit: marked for rollback, or aborted.

    PostgreSQL aborts a transaction at its first error; a view that swallowed one
    without a savepoint leaves Django unaware (``needs_rollback`` stays False). Its
    COMMIT then rolls back without raising, and Django runs the ``on_commit`` hooks
    as after a commit. libpq knows: its status is read locally, without a query.
    """
    connection = connections[alias]
    if connection.needs_rollback:
        return True
    if connection.vendor != "postgresql" or connection.connection is None:
        return False
    info = getattr(connection.connection, "info", None)
    return info is not None and int(info.transaction_status) == PQTRANS_INERROR


def roll_back(aliases: list[str]) -> None:
    for alias in aliases:
        transaction.set_rollback(True, using=alias)


def roll_back_open_transactions() -> None:
    """Mark every transaction open around the view for rollback."""
    roll_back(open_transactions())
