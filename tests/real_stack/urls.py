from django.conf.urls.i18n import i18n_patterns
from django.contrib.auth.views import LoginView
from django.urls import include, path
from django.utils.translation import gettext_lazy as _

from tests.real_stack import views

urlpatterns = [
    path("accounts/login/", LoginView.as_view()),
    path("real/form/", views.book_from_form),
    path("real/template/", views.book_with_template),
    path("real/decorated-template/", views.decorated_book_with_template),
    path("real/form-view/", views.BookingFormView.as_view()),
    path("real/decorated-form-view/", views.DecoratedBookingFormView.as_view()),
    path("real/bookings/<int:pk>/", views.booking_detail),
    path("real/queued/", views.book_then_queue),
    path("real/receipt/", views.book_with_receipt),
    path("real/gated/<str:gate>/", views.gated_booking),
    path("real/gated-atomic/<str:gate>/", views.gated_atomic_booking),
    path("real/gated-api/<str:gate>/", views.GatedApiBooking.as_view()),
    # Translated: "real/reservation/" in French (tests/real_stack/locale).
    path(_("real/booking/"), views.book_with_receipt),
    # The tests' own project: /plain/bookings/, /api/bookings/, /plain/atomic/ ...
    path("", include("tests.urls")),
    *i18n_patterns(path("real/localized-receipt/", views.book_with_receipt)),
]
