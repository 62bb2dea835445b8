"""A URLconf for the documentation's example views (tests/test_docs.py overrides ROOT_URLCONF)."""

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from tests.docs_examples import django_views, drf_views, webhooks

router = SimpleRouter()
router.register("bookings", drf_views.BookingViewSet, basename="docs-booking")
router.register("strict-bookings", drf_views.StrictBookingViewSet, basename="docs-strict")

urlpatterns = [
    path("plain/bookings/", django_views.create_booking),
    path("invoices/<int:invoice_id>/pay/", django_views.pay_invoice),
    path("vouchers/redeem/", django_views.redeem_voucher),
    path("bookings/<int:pk>/cancel/", django_views.CancelBooking.as_view()),
    path("clicks/", django_views.track_click),
    path("slots/", django_views.book_slot),
    path("api/book/", drf_views.book),
    path("api/", include(router.urls)),
    path("hooks/standard/<str:token>/", webhooks.standard_receiver),
]
