"""The quickstart's serializer: bookings/serializers.py of the fresh project."""

# --8<-- [start:serializers]
from rest_framework import serializers

from .models import Booking


class BookingSerializer(serializers.ModelSerializer):
    class Meta:
        model = Booking
        fields = ["id", "slot", "customer", "created_at"]


# --8<-- [end:serializers]
