import time
from pathlib import Path

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_save


def pause_after_write(sender, **kwargs):
    """EXAMPLE_PAUSE_AFTER_WRITE: wait after a booking's INSERT while the file exists."""
    flag = Path(settings.EXAMPLE_PAUSE_AFTER_WRITE)
    deadline = time.monotonic() + 30
    while flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


class BookingsConfig(AppConfig):
    name = "bookings"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        if settings.EXAMPLE_PAUSE_AFTER_WRITE:
            post_save.connect(pause_after_write, sender="bookings.Booking")
