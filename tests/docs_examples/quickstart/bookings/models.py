"""The quickstart's model: bookings/models.py of the fresh project."""

# --8<-- [start:models]
from django.conf import settings
from django.db import models


class Booking(models.Model):
    slot = models.DateTimeField()
    customer = models.CharField(max_length=128)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    created_at = models.DateTimeField(auto_now_add=True)


# --8<-- [end:models]
