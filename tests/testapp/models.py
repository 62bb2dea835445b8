from django.db import models


class Booking(models.Model):
    """The work a protected view does: one row per execution."""

    slot = models.CharField(max_length=64)
    customer = models.CharField(max_length=128, blank=True)
    location = models.CharField(max_length=64, blank=True)
    owner = models.ForeignKey("auth.User", null=True, on_delete=models.CASCADE)
