"""The quickstart's viewset: bookings/views.py of the fresh project."""

# --8<-- [start:views]
from rest_framework import viewsets

from idempotency_django import idempotent

from .models import Booking
from .serializers import BookingSerializer


@idempotent  # create, update, partial_update, destroy and unsafe @actions
class BookingViewSet(viewsets.ModelViewSet):
    serializer_class = BookingSerializer

    def get_queryset(self):
        return Booking.objects.filter(owner=self.request.user)

    def perform_create(self, serializer):
        serializer.save(owner=self.request.user)


# --8<-- [end:views]
