"""``manage.py demo``: the whole example in one command.

It migrates the database (SQLite in example_project/ by default), makes sure the demo
user exists with the demo password, and serves the booking page and the API with
runserver (threaded), with creating a booking slowed down so that a duplicate sent
meanwhile visibly gets ``409 idempotency_key_in_progress``. Running it again is safe.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

USERNAME = "alice"
PASSWORD = "password"
DEFAULT_DELAY_MS = 1500


class Command(BaseCommand):
    help = "Migrate, create the demo user and serve the example (booking page and API)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "addrport", nargs="?", default="127.0.0.1:8000", help="where to serve (runserver's)"
        )
        parser.add_argument(
            "--delay-ms",
            type=int,
            default=None,
            help=(
                "how long creating a booking takes, to see 409 in progress "
                f"(default: EXAMPLE_BOOKING_DELAY_MS if set, else {DEFAULT_DELAY_MS})"
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        created = self.ensure_demo_user()
        delay_ms = options["delay_ms"]
        if delay_ms is None:
            # An explicit EXAMPLE_BOOKING_DELAY_MS (even 0) wins over the demo's default.
            delay_ms = settings.EXAMPLE_BOOKING_DELAY_MS
            if not os.environ.get("EXAMPLE_BOOKING_DELAY_MS", "").strip():
                delay_ms = DEFAULT_DELAY_MS
        # The server runs in this process (no autoreloader), so it sees this value.
        settings.EXAMPLE_BOOKING_DELAY_MS = delay_ms

        host, _, port = options["addrport"].rpartition(":")
        base = f"http://{host or '127.0.0.1'}:{port}"
        self.stdout.write(
            f"Demo user: {USERNAME} / {PASSWORD} ({'created' if created else 'already there'})\n"
            f"Booking page: {base}/   API: {base}/api/bookings/   Admin: {base}/admin/\n"
            f"Creating a booking takes {delay_ms} ms: press Book twice, or send the same "
            "key twice at once, to see 409 idempotency_key_in_progress.\n"
            "Stop with Ctrl-C."
        )
        call_command("runserver", options["addrport"], use_reloader=False)

    def ensure_demo_user(self) -> bool:
        """The demo user, a superuser (for the admin), with the demo password."""
        user, created = get_user_model().objects.get_or_create(
            username=USERNAME, defaults={"email": f"{USERNAME}@example.com"}
        )
        if created or not user.check_password(PASSWORD) or not user.is_superuser:
            user.is_staff = user.is_superuser = True
            user.set_password(PASSWORD)
            user.save()
        return created
