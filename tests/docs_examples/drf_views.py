"""DRF views like docs/drf.md's (Sybil runs the page's own in the quickstart's project),
on the test project's Booking; tests/test_docs.py drives them."""

from __future__ import annotations

from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.response import Response

from idempotency_django import ViewOptions, idempotency_exempt, idempotent
from idempotency_django.drf import IdempotentMixin
from tests.testapp.models import Booking


class BookingSerializer(serializers.ModelSerializer):
    class Meta:
        model = Booking
        fields = ["id", "slot", "customer", "location"]


@idempotent  # every unsafe handler: create, update, partial_update, destroy, @actions
class BookingViewSet(viewsets.ModelViewSet):
    serializer_class = BookingSerializer

    def get_queryset(self):
        return Booking.objects.filter(owner=self.request.user)

    def perform_create(self, serializer):
        serializer.save(owner=self.request.user)

    @action(detail=True, methods=["post"])
    def confirm(self, request, pk=None):
        """Protected like the rest: an unsafe @action."""
        booking = self.get_object()
        Booking.objects.create(slot=f"confirmation-{booking.pk}", owner=request.user)
        return Response({"confirmed": booking.pk})

    @idempotent(required=True, retention=600)
    @action(detail=True, methods=["post"])
    def charge(self, request, pk=None):
        """Its own options: a key is required, the answer is kept 10 minutes."""
        Booking.objects.create(slot=f"charge-{pk}", owner=request.user)
        return Response({"charged": pk}, status=status.HTTP_201_CREATED)

    @idempotency_exempt
    @action(detail=False, methods=["post"])
    def search(self, request):
        """A POST that only reads: never deduplicated."""
        return Response({"results": []})


@api_view(["POST"])
@idempotent(retention=3600)  # below @api_view: it sees the request DRF authenticated
def book(request):
    serializer = BookingSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    serializer.save(owner=request.user)
    return Response(serializer.data, status=status.HTTP_201_CREATED)


class StrictBookingViewSet(IdempotentMixin, viewsets.ModelViewSet):
    idempotency_options = ViewOptions(required=True)  # 400 without a key
    serializer_class = BookingSerializer

    def get_queryset(self):
        return Booking.objects.filter(owner=self.request.user)

    def perform_create(self, serializer):
        serializer.save(owner=self.request.user)
