"""``manage.py purge_idempotency_records``: delete expired records and abandoned reservations.

Safe to run from cron on every app server at once; see :mod:`idempotency_django.purge`.
"""

from __future__ import annotations

from argparse import ArgumentParser, ArgumentTypeError
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import Error, connections
from django.utils.connection import ConnectionDoesNotExist

from idempotency_django.purge import (
    DEFAULT_BATCH_SIZE,
    KINDS,
    PurgeKind,
    default_database,
    parse_duration,
    purge,
)
from idempotency_django.stores import get_store


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a whole number.") from None
    if number < 1:
        raise ArgumentTypeError("it must be at least 1.")
    return number


def _pause(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a number of seconds.") from None
    if not 0 <= seconds <= 3600:
        raise ArgumentTypeError("it must be between 0 and 3600 seconds.")
    return seconds


def _duration(value: str) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ArgumentTypeError(str(exc)) from None


class Command(BaseCommand):
    help = (
        "Delete expired completed idempotency records and abandoned reservations "
        "(past their takeover time), in small batches. Live reservations and "
        "unexpired records are never touched."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=_positive_int,
            default=DEFAULT_BATCH_SIZE,
            help=f"Rows deleted per statement (default {DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Print how many rows would be deleted, and delete nothing.",
        )
        parser.add_argument(
            "--older-than",
            type=_duration,
            metavar="DURATION",
            help=(
                "Also delete completed records that finished longer ago than this "
                "(e.g. 90s, 30m, 2h, 7d), even within their retention. "
                "Reservations are still only deleted once abandoned."
            ),
        )
        parser.add_argument(
            "--pause",
            type=_pause,
            default=0.0,
            metavar="SECONDS",
            help="Sleep this long between batches, to leave the database to traffic (default 0).",
        )
        parser.add_argument(
            "--database",
            help="Database alias to purge (default: the one the idempotency store uses).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        store = get_store()
        if store.expires_by_itself:
            name = type(store).__name__.removesuffix("Store").lower() or type(store).__name__
            self.stdout.write(f"The {name} store expires entries by itself; nothing to purge.")
            return

        using: str = options["database"] or default_database()
        try:
            connections[using]
        except ConnectionDoesNotExist:
            raise CommandError(f"Unknown database {using!r}.") from None
        dry_run: bool = options["dry_run"]
        verbosity: int = options["verbosity"]

        def progress(kind: PurgeKind, deleted: int) -> None:
            if verbosity >= 2:
                self.stdout.write(f"  {kind.description}: deleted a batch of {deleted}")

        try:
            counts = purge(
                using=using,
                batch_size=options["batch_size"],
                older_than=options["older_than"],
                dry_run=dry_run,
                on_batch=progress,
                pause=options["pause"],
            )
        except Error as exc:
            raise CommandError(f"Purge failed on database {using!r}: {exc}") from exc

        verb = "Would delete" if dry_run else "Deleted"
        kinds = {kind.label: kind.description for kind in KINDS}
        for label, description in kinds.items():
            self.stdout.write(f"{verb} {counts.get(label, 0)} {description} (database {using!r}).")
        if dry_run:
            self.stdout.write("Dry run: nothing was deleted.")
