"""The example project's URLs plus the floor: the same booking viewset, undecorated."""

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from bookings.views import BookingViewSet
from example.urls import urlpatterns as example_urlpatterns
from idempotency_django.drf import IdempotentMixin

#: ``@idempotent`` returns a subclass of the original class with IdempotentMixin
#: first; the original (undecorated) class is its other base.
BareBookingViewSet = next(
    base for base in BookingViewSet.__bases__ if not issubclass(base, IdempotentMixin)
)
assert not issubclass(BareBookingViewSet, IdempotentMixin)

bare_router = SimpleRouter()
bare_router.register("bookings", BareBookingViewSet, basename="bare-booking")

urlpatterns = [path("bare/", include(bare_router.urls)), *example_urlpatterns]
