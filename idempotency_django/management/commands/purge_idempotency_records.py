"""``manage.py purge_idempotency_records``: delete expired records and abandoned reservations.

Safe to run from cron on every app server at once (see :mod:`idempotency_django.purge`).
With ``--principal`` or ``--user`` it deletes every record of one principal instead.
"""

from __future__ import annotations

import time
from argparse import ArgumentParser, ArgumentTypeError
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import Error, connections
from django.utils.connection import ConnectionDoesNotExist

from idempotency_django.protocol.scope import principal_of
from idempotency_django.purge import (
    DEFAULT_BATCH_SIZE,
    KINDS,
    PurgeKind,
    database_now,
    dead_rows,
    default_database,
    parse_duration,
    purge,
    purge_principal,
)
from idempotency_django.stores import get_store

#: The largest --batch-size: one DELETE of a million keys is already a long lock,
#: and a larger number overflows the databases' LIMIT (an SQL error, not a purge).
MAX_BATCH_SIZE = 1_000_000


def _number(kind: type[float], low: float, high: float, what: str) -> Callable[[str], Any]:
    """An argparse type: a ``kind`` from ``low`` to ``high`` (NaN and infinity are neither)."""

    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise ArgumentTypeError(f"{value!r} is not {what}.") from None
        if not low <= number <= high:
            raise ArgumentTypeError(f"it must be between {low:,} and {high:,}.")
        return number

    return parse


def _duration(value: str) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ArgumentTypeError(str(exc)) from None


class Command(BaseCommand):
    help = (
        "Delete expired completed idempotency records and abandoned reservations "
        "(past their takeover time), in small batches. Live reservations and "
        "unexpired records are never touched. With --principal or --user, delete "
        "every record of that principal instead, live or not. A long purge prints its "
        "running total every 5 seconds; -v 2 prints every batch."
    )
    #: Seconds between progress lines at the default verbosity: a short purge (cron's
    #: usual run) prints only its totals, and a long one still shows it is working.
    progress_interval = 5.0

    def add_arguments(self, parser: ArgumentParser) -> None:
        add = parser.add_argument
        add(
            "--batch-size",
            type=_number(int, 1, MAX_BATCH_SIZE, "a whole number"),
            default=DEFAULT_BATCH_SIZE,
            help=f"Rows deleted per batch, at most 1,000,000 (default {DEFAULT_BATCH_SIZE}).",
        )
        add("--dry-run", action="store_true", help="Print what would go; delete nothing.")
        add(
            "--older-than",
            type=_duration,
            metavar="DURATION",
            help="Also delete requests' stored responses completed longer ago than this "
            "(90s, 30m, 2h, 7d; at most 100 years), even within their retention. Task "
            "results and webhook deliveries keep theirs, reservations wait to be abandoned.",
        )
        add(
            "--pause",
            type=_number(float, 0, 3600, "a number of seconds"),
            default=0.0,
            metavar="SECONDS",
            help="Sleep this long between batches, to leave the database to traffic (default 0).",
        )
        add("--database", help="The database to purge (default: the store's).")
        whose = parser.add_mutually_exclusive_group()
        whose.add_argument(
            "--principal",
            help="Delete every record of this principal (e.g. auth.user:42), live or not.",
        )
        whose.add_argument(
            "--user", metavar="USERNAME", help="Like --principal, for this user's principal."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        store = get_store()
        if store.expires_by_itself:
            name = type(store).__name__.removesuffix("Store").lower() or type(store).__name__
            if options["principal"] is not None or options["user"] is not None:
                # Its keys are digests of principal, location and key: one
                # principal's entries cannot be found, only waited out.
                raise CommandError(
                    f"The {name} store cannot find one principal's entries (its keys are "
                    "hashed); they expire by themselves after RETENTION."
                )
            self.stdout.write(f"The {name} store expires entries by itself; nothing to purge.")
            return
        using: str = options["database"] or default_database()
        try:
            connections[using]
        except ConnectionDoesNotExist:
            raise CommandError(f"Unknown database {using!r}.") from None
        principal = self._principal(options)
        if principal is not None and options["older_than"] is not None:
            raise CommandError("--older-than does not apply to --principal or --user.")
        try:
            if principal is None:
                done = self._purge(using, options)
            else:
                done = [self._purge_principal(principal, using, options)]
        except Error as exc:
            raise CommandError(f"Purge failed on database {using!r}: {exc}") from exc
        verb = "Would delete" if options["dry_run"] else "Deleted"
        for what in done:
            self.stdout.write(f"{verb} {what} (database {using!r}).")
        if options["dry_run"]:
            self.stdout.write("Dry run: nothing was deleted.")

    def _purge(self, using: str, options: dict[str, Any]) -> list[str]:
        """Purge every kind of dead row; what it deleted, a line per kind."""
        verbosity: int = options["verbosity"]
        totals = dict.fromkeys((kind.label for kind in KINDS), 0)
        # Rows of a kind to delete: counted at the kind's first progress line (a
        # purge that ends sooner counts nothing), then decreased as batches go.
        expected: dict[str, int] = {}
        started = last_line = time.monotonic()

        def progress(kind: PurgeKind, deleted: int) -> None:
            nonlocal last_line
            totals[kind.label] += deleted
            now = time.monotonic()
            if verbosity >= 2 or (verbosity >= 1 and now - last_line >= self.progress_interval):
                last_line = now
                if kind.label not in expected:
                    rows = dead_rows(kind, using, database_now(using), options["older_than"])
                    expected[kind.label] = totals[kind.label] + rows.count()
                left = max(0, expected[kind.label] - totals[kind.label])
                rate = sum(totals.values()) / max(now - started, 1e-6)
                batch = f"deleted a batch of {deleted:,}, " if verbosity >= 2 else ""
                self.stdout.write(
                    f"  {kind.description}: {batch}{kind.count(totals[kind.label])} so far, "
                    f"about {left:,} left ({rate:,.0f} rows/s)"
                )

        counts = purge(
            using=using,
            batch_size=options["batch_size"],
            older_than=options["older_than"],
            dry_run=options["dry_run"],
            on_batch=progress,
            pause=options["pause"],
        )
        return [kind.count(counts[kind.label]) for kind in KINDS]

    def _principal(self, options: dict[str, Any]) -> str | None:
        principal: str | None = options["principal"]
        username: str | None = options["user"]
        for name, value in (("principal", principal), ("user", username)):
            # PostgreSQL refuses NUL in any text: a DataError, not "no such principal".
            if value is not None and "\x00" in value:
                raise CommandError(f"--{name} must not contain a NUL character.")
        if principal is not None:
            if not principal.strip():
                raise CommandError("--principal must not be empty.")
            return principal.strip()
        if username is None:
            return None
        user_model = get_user_model()
        try:
            return principal_of(user_model._default_manager.get_by_natural_key(username))
        except user_model.DoesNotExist:
            raise CommandError(
                f"No user {username!r}. For an account already deleted, pass "
                f"--principal {user_model._meta.label_lower}:<its id>."
            ) from None

    def _purge_principal(self, principal: str, using: str, options: dict[str, Any]) -> str:
        def progress(batch: Any) -> None:
            if options["verbosity"] >= 2:
                self.stdout.write(f"  deleting a batch of {len(batch)}")

        count = purge_principal(
            principal,
            using=using,
            batch_size=options["batch_size"],
            dry_run=options["dry_run"],
            on_batch=progress,
            pause=options["pause"],
        )
        return f"{count:,} {'record' if count == 1 else 'records'} of principal {principal!r}"
