"""The example's URLs, the bare viewset, a peer-protected viewset, and two helpers."""

from django.conf import settings
from django.contrib.auth import get_user_model, login
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.urls import include, path
from rest_framework.routers import DefaultRouter

from bookings.views import BookingViewSet
from example.urls import urlpatterns as example_urlpatterns
from idempotency_django.drf import IdempotentMixin

#: ``@idempotent`` made a subclass of the viewset; the undecorated class is its other base.
BareBookingViewSet = next(
    base for base in BookingViewSet.__bases__ if not issubclass(base, IdempotentMixin)
)


def peer_viewset() -> type:
    """The same viewset, protected by ``BENCH_PEER`` as its README says."""
    if settings.PEER == "drf-idempotencykey":
        from drf_idempotencykey.mixins import DrfIdempotencyKeyMixin

        return type("PeerBookingViewSet", (DrfIdempotencyKeyMixin, BareBookingViewSet), {})
    if settings.PEER == "django-idempotency-key":
        from idempotency_key.decorators import idempotency_key

        create = idempotency_key(optional=True)(BareBookingViewSet.create)
        return type("PeerBookingViewSet", (BareBookingViewSet,), {"create": create})
    return BareBookingViewSet  # drf-idempotency: its middleware protects every view


def ready(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def bench_login(request: HttpRequest) -> HttpResponse:
    """Log the benchmark user in: the answer sets the session and CSRF cookies."""
    login(request, get_user_model().objects.get(username="bench"))
    return HttpResponse(get_token(request))


# Each mounted as the example mounts its API (a DefaultRouter under a prefix, right
# after "api/"), so that resolving their URLs costs what resolving the API's does.
bare_router, peer_router = DefaultRouter(), DefaultRouter()
bare_router.register("bookings", BareBookingViewSet, basename="bare-booking")
peer_router.register("bookings", peer_viewset(), basename="peer-booking")
api = next(i for i, p in enumerate(example_urlpatterns) if str(p.pattern) == "api/")
urlpatterns = [
    *example_urlpatterns[: api + 1],
    path("bare/", include(bare_router.urls)),
    path("peer/", include(peer_router.urls)),
    *example_urlpatterns[api + 1 :],
    path("ready/", ready),
    path("bench-login/", bench_login),
]
