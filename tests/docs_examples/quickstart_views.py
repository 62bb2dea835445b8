"""The quickstart's DRF viewset (README.md); tests/test_quickstart.py serves it."""

# Booking and BookingSerializer are your project's; here, the test app's.
from tests.docs_examples.drf_views import BookingSerializer
from tests.testapp.models import Booking

# isort: split
# --8<-- [start:views]
from rest_framework import viewsets

from idempotency_django import idempotent


@idempotent  # create, update, partial_update, destroy and unsafe @actions
class BookingViewSet(viewsets.ModelViewSet):
    queryset = Booking.objects.all()
    serializer_class = BookingSerializer


# --8<-- [end:views]
