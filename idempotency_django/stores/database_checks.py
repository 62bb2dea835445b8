"""The system checks of the database store: its database, and the settings it runs under."""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from django.core import checks
from django.db import connections


def database_store_checks(alias: str, async_claim_commit: bool) -> Iterator[checks.CheckMessage]:
    """The errors and warnings of a ``DatabaseStore`` on the database ``alias``."""
    from idempotency_django.conf import idempotency_settings

    if alias not in connections.settings:
        yield checks.Error(
            f"IDEMPOTENCY['STORE_OPTIONS']['database'] is {alias!r}, which is not in DATABASES.",
            id="idempotency_django.E010",
        )
        return
    database = connections.settings[alias]
    engine = str(database["ENGINE"])
    name = str(database.get("NAME") or "")
    if engine.endswith("sqlite3") and (name == ":memory:" or "mode=memory" in name):
        yield checks.Warning(
            "The idempotency store uses an in-memory SQLite database, "
            "which each process sees on its own.",
            hint="Use a database file or a server database in production.",
            id="idempotency_django.W010",
        )
    # Settings under which claims inside transactions answer 503 instead of 409.
    options = database.get("OPTIONS") or {}
    in_transactions = bool(database.get("ATOMIC_REQUESTS")) or idempotency_settings.ATOMIC
    mode = str(options.get("transaction_mode") or "DEFERRED").upper()
    if engine.endswith("sqlite3") and in_transactions and mode != "IMMEDIATE":
        yield checks.Warning(
            f"DATABASES[{alias!r}] is SQLite with transactions around protected views, "
            "in SQLite's default DEFERRED mode: a duplicate that arrives while the first "
            "request runs gets 503 idempotency_unavailable at once instead of waiting "
            "for it (nothing runs twice either way).",
            hint='Set DATABASES[...]["OPTIONS"]["transaction_mode"] = "IMMEDIATE" '
            "(Django 5.1 or later).",
            id="idempotency_django.W011",
        )
    level = str(options.get("isolation_level") or "").lower().replace("_", " ")
    if in_transactions and ("repeatable" in level or "serializable" in level):
        yield checks.Warning(
            f"DATABASES[{alias!r}] runs transactions at {level.split('.')[-1].upper()}: "
            "claims inside them may fail with serialization errors or deadlocks, "
            "and duplicates then get 503 idempotency_unavailable instead of 409.",
            hint="Use READ COMMITTED, Django's default on PostgreSQL and MySQL/MariaDB.",
            id="idempotency_django.W012",
        )
    if async_claim_commit and not engine.endswith("postgresql"):
        yield checks.Warning(
            f"IDEMPOTENCY['STORE_OPTIONS']['async_claim_commit'] is set, but "
            f"DATABASES[{alias!r}] is not PostgreSQL: every claim still "
            "waits for the disk.",
            hint="Remove the option: only PostgreSQL commits without waiting.",
            id="idempotency_django.W013",
        )
    if not settings.USE_TZ and not engine.endswith("postgresql"):
        yield checks.Error(
            "The idempotency database store needs USE_TZ = True on this database: "
            "it compares expiries with the database's clock in UTC.",
            hint="Set USE_TZ = True (the default since Django 5.0).",
            id="idempotency_django.E012",
        )
