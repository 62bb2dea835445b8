from django.conf import settings
from django.db import models


class Booking(models.Model):
    """One booked slot. A retried request must never create a second one."""

    slot = models.DateTimeField()
    customer = models.CharField(max_length=128, blank=True)
    location = models.CharField(max_length=255, blank=True)  # X-Location-Id's limit
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="bookings"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.customer or 'booking'} at {self.slot:%Y-%m-%d %H:%M} ({self.location})"


class WebhookRun(models.Model):
    """The work one accepted webhook delivery starts."""

    event = models.CharField(max_length=128, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.event or 'event'})"
