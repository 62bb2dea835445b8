"""The database transactions around a protected view.

With ``atomic`` (the option or the ``ATOMIC`` setting) phase 1, the view and
phase 2 run in one transaction (:func:`transaction_block`). Whatever opened
them, the phases look at the transactions open around the view
(:func:`open_transactions`) to decide when an answer may be stored, and mark
them for rollback when the work must not commit.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.options import ViewOptions
from idempotency_django.stores import get_store
from idempotency_django.stores.base import in_request_transaction

#: The transaction to run phase 1, the view and phase 2 in (or none).
Block = Callable[[], contextlib.AbstractContextManager[Any]]


def transaction_block(options: ViewOptions) -> Block:
    """One transaction around claim, view and completion with ``atomic``; else none."""
    atomic = idempotency_settings.ATOMIC if options.atomic is None else options.atomic
    return atomic_block if atomic else contextlib.nullcontext


def atomic_block() -> Any:
    """A transaction on the store's database (the default database for other stores)."""
    return transaction.atomic(using=get_store().database_alias or DEFAULT_DB_ALIAS)


def open_transactions() -> list[str]:
    """The databases with a transaction open around the view (test cases' own aside)."""
    aliases = []
    for connection in connections.all(initialized_only=True):
        # Most connections have no block open: asked of a keyed request twice.
        if connection.atomic_blocks and in_request_transaction(connection):
            aliases.append(connection.alias)
    return aliases


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


def view_transaction_of(view: Callable[..., Any]) -> Block:
    """The transactions Django would open around ``view``, as a block for :func:`~.phases.run`.

    One per database with ``ATOMIC_REQUESTS`` (unless the view is marked
    ``non_atomic_requests`` for it), as Django's handler does, and one on
    the store's database under ``IDEMPOTENCY["ATOMIC"]``; none: no block.
    """
    non_atomic: set[str] = getattr(view, "_non_atomic_requests", set())
    aliases = []
    for alias, database in connections.settings.items():  # a loop: once per keyed request
        if database.get("ATOMIC_REQUESTS") and alias not in non_atomic:
            aliases.append(alias)
    if idempotency_settings.ATOMIC:
        aliases.append(get_store().database_alias or DEFAULT_DB_ALIAS)
    if not aliases:
        return contextlib.nullcontext
    return functools.partial(view_transaction, aliases)


def view_savepoint(view: Callable[..., Any]) -> tuple[str, str] | None:
    """Under ``IDEMPOTENCY["ATOMIC"]``, a savepoint before ``view`` runs in the transaction
    the middleware opened: the view's own block, as ``ATOMIC_REQUESTS`` gives a view
    (Django wraps it then, and this returns None). Its alias and id, or None.

    What the view raises rolls back to it (:func:`roll_back_view`): its writes, not
    the claim before them, so its 4xx may still be kept, and nothing of the
    transactions around the middleware's.
    """
    if not idempotency_settings.ATOMIC:
        return None
    alias = get_store().database_alias or DEFAULT_DB_ALIAS
    if connections.settings[alias].get("ATOMIC_REQUESTS") and alias not in getattr(
        view, "_non_atomic_requests", set()
    ):
        return None  # Django's own block around the view
    if not connections[alias].in_atomic_block:
        return None  # an async view: no transaction
    return alias, transaction.savepoint(using=alias)


def roll_back_view(savepoint: tuple[str, str]) -> None:
    """Undo what the view wrote since :func:`view_savepoint`."""
    alias, savepoint_id = savepoint
    transaction.savepoint_rollback(savepoint_id, using=alias)


def view_transaction(aliases: list[str]) -> contextlib.ExitStack:
    """The transactions of ``aliases`` (:func:`view_transaction_of`), opened here for the view.

    The store's database is opened first, so that it commits last: a stored
    response never commits before the work it answers for.

    A database that committed stays committed: an ``on_commit`` hook of the
    view that raises after one of the inner commits must not roll back the
    transactions around it (the store's, with the claim). They commit as
    they would have, then the hook's error goes on (:class:`CommittedThenRaise`).
    """
    store_alias = get_store().database_alias
    aliases = sorted(aliases, key=lambda alias: alias != store_alias)
    stack = contextlib.ExitStack()
    raised_after_commit: list[BaseException] = []
    stack.push(functools.partial(_raise_after_all, raised_after_commit))  # exited last
    for position, alias in enumerate(dict.fromkeys(aliases)):
        block = transaction.atomic(using=alias)
        if position == 0:
            stack.enter_context(block)  # the outermost: nothing around it to roll back
        else:
            stack.enter_context(CommittedThenRaise(alias, block, raised_after_commit))
    return stack


class CommittedThenRaise:
    """A transaction inside others: an error raised after its COMMIT succeeded (by an
    ``on_commit`` hook that is not robust) is kept for later, not raised into them.

    Without it the error would reach the outer transactions' exits, which roll back:
    the store's, with the claim, would free the key of work already committed here,
    and a retry would run it again. The outer ones commit instead, as they would have
    without the hook, the answer is stored, and the error goes on after them.
    """

    def __init__(self, alias: str, block: Any, raised_after_commit: list[BaseException]) -> None:
        self.alias = alias
        self.block = block
        self.raised_after_commit = raised_after_commit
        self.committed = False

    def __enter__(self) -> None:
        self.block.__enter__()
        # Robust, and hooked before the view's: it runs when (and only when) this commits,
        # after the completion (reservation.py hooks it first) and before the view's hooks.
        transaction.on_commit(self.mark_committed, using=self.alias, robust=True)

    def mark_committed(self) -> None:
        self.committed = True

    def __exit__(self, *exc_info: Any) -> bool:
        try:
            return bool(self.block.__exit__(*exc_info))
        except Exception as error:
            if exc_info[0] is not None or not self.committed:
                raise  # the view failed, or the COMMIT did: the outer ones roll back
            self.raised_after_commit.append(error)
            return False


def _raise_after_all(raised_after_commit: list[BaseException], exc_type: Any, *_: Any) -> None:
    """Once every transaction is closed: the first error a hook raised after a commit."""
    if exc_type is None and raised_after_commit:
        raise raised_after_commit[0]
