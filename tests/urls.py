from django.contrib import admin
from django.urls import include, path, register_converter
from rest_framework.routers import SimpleRouter

from tests.testapp import ninja_api, views

register_converter(views.TenantConverter, "tenant")

router = SimpleRouter()
router.register("bookings", views.BookingViewSet, basename="booking")
router.register("mixin-bookings", views.MixinBookingViewSet, basename="mixin-booking")
router.register("unprotected-bookings", views.UnprotectedBookingViewSet, basename="unprotected")
router.register("windowed-bookings", views.WindowedBookingViewSet, basename="windowed")
router.register("strict-bookings", views.StrictBookingViewSet, basename="strict")
router.register(
    "decorated-mixin-bookings", views.DecoratedMixinBookingViewSet, basename="decorated-mixin"
)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("plain/bookings/", views.create_booking),
    path("window/bookings/", views.windowed_booking),
    path("plain/token-bookings/", views.token_booking),
    path("plain/no-response/", views.returns_no_response),
    path("plain/no-response-atomic/", views.atomic_returns_no_response),
    path("plain/exempt/", views.exempt_booking),
    path("plain/required/", views.required_booking),
    path("plain/client-error/", views.client_error_booking),
    path("plain/atomic/", views.atomic_booking),
    path("plain/cbv/", views.BookingCBV.as_view()),
    path("plain/click-counter/", views.ClickCounterCBV.as_view()),
    path("plain/plain-click/", views.PlainClickCBV.as_view()),
    path("plain/slot-cbv/", views.SlotCBV.as_view()),
    path("plain/slot-under-class/", views.SlotUnderClassCBV.as_view()),
    path("async/click-counter/", views.AsyncClickCounterCBV.as_view()),
    path("plain/fragile/", views.fragile_booking),
    path("plain/paused/", views.paused_booking),
    path("plain/form/", views.form_booking),
    path("plain/large/", views.large_booking),
    path("plain/slot/", views.slot_booking),
    path("plain/nonce/", views.nonce_booking),
    path("plain/organisation/", views.organisation_booking),
    path("plain/organisation-upload/", views.OrganisationUploadCBV.as_view()),
    path("plain/guest/", views.guest_booking),
    path("api/slot/", views.api_slot_booking),
    path("api/public/", views.api_public_booking),
    path("plain/small-limit/", views.small_limit_booking),
    path("api/form/", views.api_form_booking),
    path("api/book/", views.api_book),
    path("api/charge-then-audit/", views.ChargeThenAudit.as_view()),
    path("api/routed-book/", views.BookingViewSet.as_view({"post": "book"})),
    path("async/bookings/", views.async_booking),
    path("async/decorated/", views.decorated_async_booking),
    path("async/decorated-cbv/", views.AsyncBookingCBV.as_view()),
    path("async/failing/", views.async_failing_booking),
    path("hooks/<str:token>/", views.webhook_receiver),
    path("hooks/fallback/<str:token>/", views.fallback_webhook_receiver),
    path("hooks/async/<str:token>/", views.async_webhook_receiver),
    path("tenants/<tenant:tenant>/hooks/<str:token>/", views.tenant_webhook_receiver),
    path("hooks/form/<str:token>/", views.form_webhook_receiver),
    path("hooks/form-token/<str:token>/", views.form_token_webhook_receiver),
    path("api/hooks/<str:token>/", views.drf_webhook_receiver),
    path("api/", include(router.urls)),
    path("ninja/", ninja_api.api.urls),
    path("ninja-whole/", ninja_api.whole_api.urls),
]
